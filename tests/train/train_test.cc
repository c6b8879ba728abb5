#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <tuple>

#include "common/file_util.h"
#include "distca/dataset.h"
#include "train/train_testing.h"

namespace distca {
namespace {

using testing::TinyTrainOptions;
using testing::TrainAndCollect;
using testing::TrainResult;

Status RunLocal(int ranks, const std::function<Status(Comm&)>& fn) {
  CommOptions o;
  o.backend = CommOptions::Backend::kLocal;
  o.local_ranks = ranks;
  return RunOnRanks(o, fn);
}

TEST(TrainTest, CadEqualsColocatedOnFourLocalRanks) {
  const Status s = RunLocal(4, [](Comm& comm) { return testing::CheckCadEqualsColocated(comm); });
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(TrainTest, DedicatedServerEqualsColocated) {
  TrainResult ref, got;
  TrainOptions t = TinyTrainOptions(3);
  t.attention = AttentionMode::kColocated;
  Status s = RunLocal(3, [&](Comm& comm) { return TrainAndCollect(comm, t, "ref", &ref); });
  ASSERT_TRUE(s.ok()) << s.ToString();
  t.attention = AttentionMode::kCad;
  t.servers = 1;
  s = RunLocal(4, [&](Comm& comm) { return TrainAndCollect(comm, t, "server", &got); });
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = testing::CompareRuns(ref, got, t, "one dedicated server");
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// Planned by a measured table instead of FLOPs, CAD moves other rows (a
// table that charges a causal pair more the longer the task's prefix) and
// still trains exactly as colocated.
TEST(TrainTest, CadPlannedByACostTableEqualsColocated) {
  TrainResult ref, got;
  TrainOptions t = TinyTrainOptions(3);
  t.attention = AttentionMode::kColocated;
  Status s = RunLocal(3, [&](Comm& comm) { return TrainAndCollect(comm, t, "table-ref", &ref); });
  ASSERT_TRUE(s.ok()) << s.ToString();
  t.attention = AttentionMode::kCad;
  std::vector<int64_t> flops_bytes, table_bytes;
  s = RunLocal(3, [&](Comm& comm) {
    return Train(comm, t, [&](const StepMetrics& m) { flops_bytes.push_back(m.comm_bytes); });
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  CostModel table;
  ASSERT_TRUE(CostModel::FromTableCsv("q_len,kv_len,seconds\n1,1,1e-9\n1,1024,3e-6\n1024,1024,1e-3\n", &table).ok());
  t.cost_table = table;
  s = RunLocal(3, [&](Comm& comm) { return TrainAndCollect(comm, t, "table", &got); });
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = testing::CompareRuns(ref, got, t, "planned by a cost table");
  EXPECT_TRUE(s.ok()) << s.ToString();
  s = RunLocal(3, [&](Comm& comm) {
    return Train(comm, t, [&](const StepMetrics& m) { table_bytes.push_back(m.comm_bytes); });
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NE(table_bytes, flops_bytes);
  // Ranks given different tables (or one none) would plan different
  // exchanges: refused before the first step.
  CostModel other;
  ASSERT_TRUE(CostModel::FromTableCsv("q_len,kv_len,seconds\n1,1,1e-9\n1,1024,3e-6\n1024,1024,2e-3\n", &other).ok());
  for (const std::optional<CostModel>& rank1 : {std::optional<CostModel>(other), std::optional<CostModel>()}) {
    s = RunLocal(3, [&](Comm& comm) {
      TrainOptions mine = t;
      if (comm.rank() == 1) mine.cost_table = rank1;
      return Train(comm, mine, nullptr);
    });
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_NE(s.message().find("plan with another cost table than rank 0"), std::string::npos) << s.ToString();
  }
}

TEST(TrainTest, LossDecreases) {
  TrainOptions t = TinyTrainOptions(2);
  t.steps = 12;
  t.lr = 3e-3f;
  t.data.batches = {t.data.batches[0]};  // the same batch every step
  TrainResult r;
  const Status s = RunLocal(2, [&](Comm& comm) { return TrainAndCollect(comm, t, "decrease", &r); });
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(r.losses.size(), 12u);
  EXPECT_NEAR(r.losses[0], std::log(256.0), 0.1);  // untrained: about uniform over 256 byte values
  EXPECT_LT(r.losses.back(), r.losses[0] - 0.5);
}

// Four steps straight equal two steps, save, load, two steps: bitwise.
TEST(TrainTest, ResumeIsExact) {
  for (AttentionMode mode : {AttentionMode::kColocated, AttentionMode::kCad}) {
    TrainOptions t = TinyTrainOptions(2);
    t.attention = mode;
    t.steps = 4;
    t.data.batches.push_back({300, 724});
    TrainResult straight;
    Status s = RunLocal(2, [&](Comm& comm) { return TrainAndCollect(comm, t, "straight", &straight); });
    ASSERT_TRUE(s.ok()) << s.ToString();

    const std::string dir = testing::ScratchDir("resume");
    std::filesystem::remove_all(dir);
    std::vector<double> resumed;
    TrainOptions first = t;
    first.steps = 2;
    first.lr_decay_steps = 4;  // the same schedule as the 4-step run
    first.save_dir = dir;
    s = RunLocal(
        2, [&](Comm& comm) { return Train(comm, first, [&](const StepMetrics& m) { resumed.push_back(m.loss); }); });
    ASSERT_TRUE(s.ok()) << s.ToString();
    TrainOptions second = t;
    second.load_dir = dir;
    // Another schedule (here a run of 6 steps, which by default decays over
    // 6) would train the resumed steps differently: refused.
    TrainOptions longer = second;
    longer.steps = 6;
    s = RunLocal(2, [&](Comm& comm) { return Train(comm, longer, nullptr); });
    EXPECT_NE(s.message().find("decay over 4 steps; this run's is lr 0.001 to min-lr 0.0001, warmup 0 steps, decay "
                               "over 6 steps"),
              std::string::npos)
        << s.ToString();
    s = RunLocal(
        2, [&](Comm& comm) { return Train(comm, second, [&](const StepMetrics& m) { resumed.push_back(m.loss); }); });
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(resumed.size(), 4u);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(resumed[i], straight.losses[i]) << AttentionModeName(mode) << " step " << i + 1;
    std::filesystem::remove_all(dir);
  }
}

TEST(TrainTest, CheckpointRoundTripAndCorruption) {
  ModelConfig c;
  ASSERT_TRUE(ModelPreset("tiny", &c).ok());
  std::unique_ptr<Transformer> model, other;
  ASSERT_TRUE(Transformer::Create(c, &model).ok());
  model->InitWeights(7);
  AdamW opt(*model, {});
  for (size_t i = 0; i < opt.m().size(); ++i) {
    opt.m()[i] = float(i % 13) * 0.5f;
    opt.v()[i] = float(i % 7) * 0.25f;
  }
  opt.set_step(5);
  const std::string dir = testing::ScratchDir("ckpt");
  std::filesystem::remove_all(dir);
  const LrSchedule schedule{3e-3f, 1e-4f, 2, 40};
  ASSERT_TRUE(SaveCheckpoint(dir, *model, opt, {5, {5, 1, 2, 3}, 42, schedule}).ok());

  ASSERT_TRUE(Transformer::Create(c, &other).ok());
  AdamW opt2(*other, {});
  TrainState st;
  Status s = LoadCheckpoint(dir, other.get(), &opt2, &st);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(st.step, 5);
  EXPECT_EQ(st.seed, 42u);
  EXPECT_EQ(st.data.cursor, 2);
  EXPECT_TRUE(st.schedule == schedule) << DescribeSchedule(st.schedule);
  EXPECT_EQ(opt2.step(), 5);
  EXPECT_EQ(std::memcmp(model->params(), other->params(), sizeof(float) * size_t(model->size())), 0);
  EXPECT_EQ(opt.m(), opt2.m());
  EXPECT_EQ(opt.v(), opt2.v());

  // A different model shape is refused, and nothing is loaded.
  ModelConfig wide = c;
  wide.hidden = 128;
  std::unique_ptr<Transformer> mismatched;
  ASSERT_TRUE(Transformer::Create(wide, &mismatched).ok());
  AdamW opt3(*mismatched, {});
  s = LoadCheckpoint(dir, mismatched.get(), &opt3, &st);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("written for another model: hidden 128 here, 64 there"), std::string::npos) << s.message();

  // A truncated weights file is refused before anything is copied.
  const std::string weights = dir + "/step-00000005/model.safetensors";
  std::filesystem::resize_file(weights, std::filesystem::file_size(weights) - 100);
  std::unique_ptr<Transformer> fresh;
  ASSERT_TRUE(Transformer::Create(c, &fresh).ok());
  fresh->InitWeights(9);
  std::vector<float> before(fresh->params(), fresh->params() + fresh->size());
  AdamW opt4(*fresh, {});
  s = LoadCheckpoint(dir, fresh.get(), &opt4, &st);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model.safetensors"), std::string::npos) << s.message();
  EXPECT_EQ(std::memcmp(before.data(), fresh->params(), sizeof(float) * before.size()), 0);

  // Saving the same step again replaces the broken one (swapped in whole):
  // it loads, with the new state, and no scratch directory is left.
  ASSERT_TRUE(SaveCheckpoint(dir, *model, opt, {5, {5, 1, 4, 3}, 43, schedule}).ok());
  s = LoadCheckpoint(dir, fresh.get(), &opt4, &st);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(st.seed, 43u);
  EXPECT_EQ(st.data.cursor, 4);
  EXPECT_EQ(std::memcmp(model->params(), fresh->params(), sizeof(float) * size_t(model->size())), 0);
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) entries += e.path().filename() != "latest";
  EXPECT_EQ(entries, 1);  // step-00000005 alone

  // Moments from another step, or with a tensor too many, are refused before
  // the weights or the moments are copied.
  const std::string other_dir = testing::ScratchDir("ckpt-other");
  std::filesystem::remove_all(other_dir);
  ASSERT_TRUE(SaveCheckpoint(other_dir, *model, opt, {6, {6, 1, 2, 3}, 43, schedule}).ok());
  const std::string moments = dir + "/step-00000005/optimizer.safetensors";
  std::filesystem::copy_file(other_dir + "/step-00000006/optimizer.safetensors", moments,
                             std::filesystem::copy_options::overwrite_existing);
  std::unique_ptr<Transformer> untouched;
  ASSERT_TRUE(Transformer::Create(c, &untouched).ok());
  untouched->InitWeights(11);
  const std::vector<float> initial(untouched->params(), untouched->params() + untouched->size());
  AdamW opt5(*untouched, {});
  s = LoadCheckpoint(dir, untouched.get(), &opt5, &st);
  EXPECT_NE(s.message().find("optimizer.safetensors: not from step 5"), std::string::npos) << s.ToString();
  const float extra[1] = {1};
  std::vector<NamedTensor> tensors = {{"m.extra", {1}, extra}};
  for (const ParamTensor& t : model->tensors()) {
    tensors.push_back({"m." + t.name, t.shape, opt.m().data() + t.offset});
    tensors.push_back({"v." + t.name, t.shape, opt.v().data() + t.offset});
  }
  ASSERT_TRUE(WriteSafetensors(moments, tensors, {{"step", "5"}}).ok());
  s = LoadCheckpoint(dir, untouched.get(), &opt5, &st);
  EXPECT_NE(s.message().find("tensors, the model needs"), std::string::npos) << s.ToString();
  EXPECT_EQ(std::memcmp(initial.data(), untouched->params(), sizeof(float) * initial.size()), 0);
  for (size_t i = 0; i < opt5.m().size(); ++i) ASSERT_TRUE(opt5.m()[i] == 0.0f && opt5.v()[i] == 0.0f) << i;
  tensors.erase(tensors.begin());  // without the extra tensor it loads
  ASSERT_TRUE(WriteSafetensors(moments, tensors, {{"step", "5"}}).ok());
  s = LoadCheckpoint(dir, untouched.get(), &opt5, &st);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(opt.m(), opt5.m());
  EXPECT_EQ(opt.v(), opt5.v());
  std::filesystem::remove_all(other_dir);

  // state.json's numbers: whole, non-negative, the optimizer at the step.
  const std::string state_path = dir + "/step-00000005/state.json";
  std::string good_state;
  ASSERT_TRUE(ReadTextFile(state_path, &good_state).ok());
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good_state;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    std::ofstream(state_path) << text;
  };
  for (const auto& [from, to, message] :
       {std::tuple<std::string, std::string, std::string>{"\"step\": 5", "\"step\": 5.5",
                                                          "'step' must be a whole number"},
        {"\"seed\": 43", "\"seed\": -1", "'seed' must be a whole number >= 0, got -1"},
        {"\"optimizer_step\": 5", "\"optimizer_step\": 0", "optimizer_step 0 is not the step 5"},
        // (the first "step" is the data position's: keys are sorted)
        {"\"step\": 5", "\"step\": 4", "data step 4 is not the step 5"},
        {"\"cursor\": 4", "\"cursor\": true", "'cursor' must be a whole number"},
        {"\"decay_steps\": 40", "\"decay_stepz\": 40", "lacks 'decay_steps'"}}) {
    with(from, to);
    s = LoadCheckpoint(dir, fresh.get(), &opt4, &st);
    EXPECT_NE(s.message().find(message), std::string::npos) << to << ": " << s.ToString();
  }
  with("\"step\": 5", "\"step\": 5");  // unchanged: loads
  ASSERT_TRUE(LoadCheckpoint(dir, fresh.get(), &opt4, &st).ok());

  // Values a save never writes are refused before anything is copied: a
  // negative second moment, a non-finite weight.
  std::vector<float> bad_v = opt.v(), bad_weights(model->params(), model->params() + model->size());
  bad_v[7] = -1.0f;
  bad_weights[2] = std::numeric_limits<float>::quiet_NaN();
  std::vector<NamedTensor> bad_moments, bad_model;
  for (const ParamTensor& t : model->tensors()) {
    bad_moments.push_back({"m." + t.name, t.shape, opt.m().data() + t.offset});
    bad_moments.push_back({"v." + t.name, t.shape, bad_v.data() + t.offset});
    bad_model.push_back({t.name, t.shape, bad_weights.data() + t.offset});
  }
  const std::vector<float> loaded(fresh->params(), fresh->params() + fresh->size());
  ASSERT_EQ(model->tensors()[0].name, "embed");
  ASSERT_TRUE(WriteSafetensors(moments, bad_moments, {{"step", "5"}}).ok());
  s = LoadCheckpoint(dir, fresh.get(), &opt4, &st);
  EXPECT_NE(s.message().find("tensor 'v.embed' holds -1 at element 7"), std::string::npos) << s.ToString();
  ASSERT_TRUE(WriteSafetensors(moments, tensors, {{"step", "5"}}).ok());
  const std::string good_weights = dir + "/step-00000005/model.safetensors.good";
  std::filesystem::copy_file(weights, good_weights);
  ASSERT_TRUE(WriteSafetensors(weights, bad_model, {{"step", "5"}}).ok());
  s = LoadCheckpoint(dir, fresh.get(), &opt4, &st);
  EXPECT_NE(s.message().find("tensor 'embed' holds nan at element 2"), std::string::npos) << s.ToString();
  EXPECT_EQ(std::memcmp(loaded.data(), fresh->params(), sizeof(float) * loaded.size()), 0);
  std::filesystem::rename(good_weights, weights);
  ASSERT_TRUE(LoadCheckpoint(dir, fresh.get(), &opt4, &st).ok());

  // `latest` names one step directory on one short line: a long file is not
  // read (a 4 GB one filled memory), nor a name outside the directory.
  const std::string latest = dir + "/latest";
  const std::string good_latest = latest + ".good";
  std::filesystem::copy_file(latest, good_latest);
  std::ofstream(latest) << std::string(5000, 'a');
  s = LoadCheckpoint(dir, fresh.get(), &opt4, &st);
  EXPECT_NE(s.message().find("latest is malformed: over 4096 bytes"), std::string::npos) << s.ToString();
  for (const char* name : {"..", "step-00000005/../..", "step\x01", ""}) {
    std::ofstream(latest, std::ios::trunc) << name << "\n";
    s = LoadCheckpoint(dir, fresh.get(), &opt4, &st);
    EXPECT_NE(s.message().find("latest is malformed"), std::string::npos) << name << ": " << s.ToString();
  }
  std::filesystem::rename(good_latest, latest);
  ASSERT_TRUE(LoadCheckpoint(dir, fresh.get(), &opt4, &st).ok());

  // Non-finite weights or moments are not saved.
  opt.v()[3] = std::numeric_limits<float>::infinity();
  s = SaveCheckpoint(dir, *model, opt, {6, {6, 1, 2, 3}, 42, schedule});
  EXPECT_NE(s.message().find("step 6: second moments of 'embed' are not finite"), std::string::npos) << s.ToString();
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-00000006"));

  // Garbage state.json.
  std::ofstream(dir + "/step-00000005/state.json") << "{not json";
  s = LoadCheckpoint(dir, fresh.get(), &opt4, &st);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("state.json"), std::string::npos) << s.message();
  EXPECT_FALSE(LoadCheckpoint(dir + "/missing", fresh.get(), &opt4, &st).ok());
  std::filesystem::remove_all(dir);
}

TEST(TrainTest, SafetensorsRejectsBadHeaders) {
  const std::string dir = testing::ScratchDir("st");
  std::filesystem::create_directories(dir);
  const float x[3] = {1, 2, 3};
  ASSERT_TRUE(WriteSafetensors(dir + "/a.safetensors", {{"x", {3}, x}}, {{"k", "v"}}).ok());
  SafetensorsFile f;
  ASSERT_TRUE(ReadSafetensors(dir + "/a.safetensors", &f).ok());
  ASSERT_NE(f.Find("x"), nullptr);
  EXPECT_EQ(f.Find("x")->values, std::vector<float>({1, 2, 3}));
  ASSERT_EQ(f.metadata.size(), 1u);
  const auto write_raw = [&](const std::string& header, size_t data_bytes) {
    std::ofstream out(dir + "/b.safetensors", std::ios::binary);
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << std::string(data_bytes, '\0');
  };
  const auto refused_with = [&](const std::string& message) {
    const Status bad = ReadSafetensors(dir + "/b.safetensors", &f);
    EXPECT_NE(bad.message().find(message), std::string::npos) << bad.ToString();
  };
  write_raw(R"({"x":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 4);
  refused_with("has dtype \"F16\"; only F32 is supported");
  write_raw(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})", 12);
  refused_with("data_offsets [0, 12) do not match its shape");
  write_raw(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4);
  refused_with("tensor 'x': its shape holds more elements than the file's 4 data bytes");
  write_raw("[1,2", 0);
  refused_with("not valid JSON");
  for (const char* shape : {"3", R"({"a":3})"}) {  // not an array
    write_raw(std::string(R"({"x":{"dtype":"F32","shape":)") + shape + R"(,"data_offsets":[0,12]}})", 12);
    const Status bad = ReadSafetensors(dir + "/b.safetensors", &f);
    EXPECT_NE(bad.message().find("shape is not an array"), std::string::npos) << shape << ": " << bad.ToString();
  }
  // A shape whose element count wraps (2^62 x 4 bytes = 0 mod 2^64) or
  // outgrows the file is refused before anything is allocated.
  write_raw(R"({"x":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0);
  Status s = ReadSafetensors(dir + "/b.safetensors", &f);
  EXPECT_NE(s.message().find("holds more elements than the file's 0 data bytes"), std::string::npos) << s.ToString();
  write_raw(R"({"x":{"dtype":"F32","shape":[65536,65536,65536],"data_offsets":[0,8]}})", 8);
  s = ReadSafetensors(dir + "/b.safetensors", &f);
  EXPECT_NE(s.message().find("holds more elements"), std::string::npos) << s.ToString();
  write_raw(R"({"x":{"dtype":"F32","shape":[65536,0,65536],"data_offsets":[0,0]}})", 0);
  EXPECT_TRUE(ReadSafetensors(dir + "/b.safetensors", &f).ok());  // no elements at all
  std::filesystem::remove_all(dir);
}

// The trainer's first step against the single-process oracle
// (ModelLossAndGrad over the same batch): loss and gradient norm agree,
// colocated and CAD, up to the order of float sums. CAD is otherwise only
// compared with colocated, which shares the trainer's row layout, loss
// scaling and all-reduce with it. Both start from the initial weights
// scaled by 5 (through a checkpoint): at the initial scale attention is
// nearly uniform, and a position error (a piece's RoPE restarting at 0)
// moved the loss by 7e-7 relative, inside the tolerance; at this scale by
// about 4e-4.
TEST(TrainTest, FirstStepMatchesTheSingleProcessOracle) {
  constexpr float kSharpen = 5.0f;
  for (AttentionMode mode : {AttentionMode::kColocated, AttentionMode::kCad}) {
    TrainOptions t = TinyTrainOptions(2);
    t.attention = mode;
    t.steps = 1;
    t.grad_clip = 0;  // the reported norm is the unclipped one either way; no clip keeps it simple
    std::unique_ptr<Transformer> model;
    ASSERT_TRUE(Transformer::Create(t.model, &model).ok());
    model->InitWeights(t.seed);
    for (int64_t i = 0; i < model->size(); ++i) model->params()[i] *= kSharpen;
    t.load_dir = testing::ScratchDir("oracle");
    std::filesystem::remove_all(t.load_dir);
    TrainState start;
    start.seed = t.seed;
    start.schedule = {t.lr, t.min_lr, t.warmup_steps, t.steps};
    ASSERT_TRUE(SaveCheckpoint(t.load_dir, *model, AdamW(*model, t.adamw), start).ok());
    double loss = 0, grad_norm = 0;
    Status s = RunLocal(2, [&](Comm& comm) {
      return Train(comm, t, [&](const StepMetrics& m) {
        loss = m.loss;
        grad_norm = m.grad_norm;
      });
    });
    std::filesystem::remove_all(t.load_dir);
    ASSERT_TRUE(s.ok()) << s.ToString();

    DataOptions d = t.data;
    d.seed = t.seed;
    d.vocab_size = t.model.vocab_size;
    d.tokens_per_batch = 2 * t.tokens_per_rank;
    std::unique_ptr<BatchStream> stream;
    ASSERT_TRUE(BatchStream::Open(d, &stream).ok());
    Batch batch;
    ASSERT_TRUE(stream->Next(&batch).ok());
    model->ZeroGrads();
    int64_t targets = 0;
    for (const auto& doc : batch.docs) targets += int64_t(doc.size()) - 1;
    double sum = 0;
    int64_t counted = 0;
    ASSERT_TRUE(ModelLossAndGrad(model.get(), batch.docs, 1.0 / double(targets), &sum, &counted).ok());
    ASSERT_EQ(counted, targets);
    double norm2 = 0;
    for (int64_t i = 0; i < model->size(); ++i) norm2 += double(model->grads()[i]) * double(model->grads()[i]);
    EXPECT_NEAR(loss, sum / double(targets), 1e-6 * loss) << AttentionModeName(mode);
    EXPECT_NEAR(grad_norm, std::sqrt(norm2), 1e-5 * grad_norm) << AttentionModeName(mode);
  }
}

// Ranks that resume from different checkpoints (possible under mpirun, where
// each process loads its own --load) are refused before the first step: at
// different steps they waited on each other's collectives forever.
TEST(TrainTest, RanksMustResumeFromOneState) {
  TrainOptions t = TinyTrainOptions(2);
  t.steps = 2;
  t.lr_decay_steps = 3;
  t.save_every = 1;
  t.save_dir = testing::ScratchDir("resume-apart");
  std::filesystem::remove_all(t.save_dir);
  Status s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
  ASSERT_TRUE(s.ok()) << s.ToString();
  TrainOptions resume = t;
  resume.save_dir.clear();
  resume.steps = 3;
  s = RunLocal(2, [&](Comm& comm) {
    TrainOptions mine = resume;
    mine.load_dir = t.save_dir + (comm.rank() == 0 ? "/step-00000001" : "/step-00000002");
    return Train(comm, mine, nullptr);
  });
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("from another state than rank 0: every rank must resume from the same"), std::string::npos)
      << s.ToString();
  // The same checkpoint on both ranks resumes.
  resume.load_dir = t.save_dir + "/step-00000002";
  s = RunLocal(2, [&](Comm& comm) { return Train(comm, resume, nullptr); });
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::filesystem::remove_all(t.save_dir);
}

// A diverging run (a finite but absurd rate: step 1 moves every weight by
// about 1e30) stops at the first non-finite loss or gradient norm, on every
// rank, before the update; the checkpoint of step 1 holds finite weights,
// and none is written after.
TEST(TrainTest, DivergenceStopsTheRun) {
  TrainOptions t = TinyTrainOptions(2);
  t.lr = 1e30f;
  t.min_lr = 0;
  t.steps = 3;
  t.save_dir = testing::ScratchDir("diverge");
  t.save_every = 1;
  std::filesystem::remove_all(t.save_dir);
  const Status s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("step 2: the "), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("is not finite (lower --lr?)"), std::string::npos) << s.ToString();
  EXPECT_TRUE(std::filesystem::exists(t.save_dir + "/step-00000001"));
  EXPECT_FALSE(std::filesystem::exists(t.save_dir + "/step-00000002"));
  std::filesystem::remove_all(t.save_dir);
}

TEST(TrainTest, BadOptionsAreRejected) {
  TrainOptions t = TinyTrainOptions(2);
  t.model.q_heads = 6;  // not a multiple of the 2 query groups... and 64 % 6 != 0
  Status s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
  EXPECT_NE(s.message().find("is not a multiple of num_attention_heads 6"), std::string::npos) << s.message();
  t = TinyTrainOptions(2);
  t.tokens_per_rank = 64;
  s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("smaller than one block"), std::string::npos) << s.message();
  // A warmup longer than the cosine schedule; one as long is accepted.
  t = TinyTrainOptions(2);
  t.steps = 1;
  t.lr_decay_steps = 5;
  t.warmup_steps = 6;
  s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
  EXPECT_NE(s.message().find("--warmup-steps 6 is longer than the learning-rate schedule (5 steps"), std::string::npos)
      << s.message();
  t.warmup_steps = 5;
  s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
  EXPECT_TRUE(s.ok()) << s.ToString();
  t.warmup_steps = -1;
  s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
  EXPECT_NE(s.message().find("must be >= 0"), std::string::npos) << s.message();
  t = TinyTrainOptions(2);
  t.model.vocab_size = 1;
  s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
  EXPECT_NE(s.message().find("--vocab-size must be >= 2, got 1"), std::string::npos) << s.message();
  t = TinyTrainOptions(2);
  t.servers = 2;
  s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
  EXPECT_NE(s.message().find("--servers 2 leaves no rank for the model"), std::string::npos) << s.message();
  t = TinyTrainOptions(2);
  t.servers = 1;
  t.policy = PlanPolicy::kColocated;  // would leave the server idle
  s = RunLocal(3, [&](Comm& comm) { return Train(comm, t, nullptr); });
  EXPECT_NE(s.message().find("a colocated plan gives dedicated servers no work"), std::string::npos) << s.message();
  // Rates and optimizer settings that could only write non-finite weights.
  const float inf = std::numeric_limits<float>::infinity();
  for (const auto& [set, message] : std::vector<std::pair<std::function<void(TrainOptions*)>, std::string>>{
           {[&](TrainOptions* o) { o->lr = inf; }, "--lr > 0 and finite"},
           {[&](TrainOptions* o) { o->adamw.weight_decay = inf; }, "--weight-decay must be finite"},
           {[&](TrainOptions* o) { o->adamw.weight_decay = std::nanf(""); }, "--weight-decay must be finite"},
           {[&](TrainOptions* o) { o->adamw.beta1 = 1; }, "betas in [0, 1)"},
           {[&](TrainOptions* o) { o->adamw.eps = 0; }, "a finite eps > 0"},
           {[&](TrainOptions* o) { o->grad_clip = double(inf); }, "--clip-grad must be finite"}}) {
    t = TinyTrainOptions(2);
    set(&t);
    s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
    EXPECT_NE(s.message().find(message), std::string::npos) << s.ToString();
  }
  // Two local ranks share the process: 2 x (16 bytes per parameter + the
  // activations' lower bound) must fit.
  t = TinyTrainOptions(2);
  const ModelConfig& m = t.model;
  const double state = 16.0 * double(ParameterCount(m));
  // Floats kept per token and layer: ModelPass's x, h, attention output,
  // x_mid, g (5h), gate and up (2 ffn), two rstd (2); the executor's Q and O
  // (2 Hq D), K and V (2 Hkv D), LSE (Hq).
  const auto kept = [](const ModelConfig& c) {
    return 5.0 * c.hidden + 2.0 * c.q_heads * c.head_dim() + 2.0 * c.kv_heads * c.head_dim() + 2.0 * c.ffn_hidden +
           c.q_heads + 2.0;
  };
  // Floats per token outside the layers: ModelPass's last output and
  // residual gradient (2h), rotary tables (D); the executor's dO and dQ
  // (2 Hq D), dK and dV (2 Hkv D).
  const auto outside = [](const ModelConfig& c) {
    return 2.0 * c.hidden + c.head_dim() + 2.0 * (c.q_heads + c.kv_heads) * c.head_dim();
  };
  // Floats per row of the largest nano-batch (half the tokens: CAD with
  // ping-pong): ModelPass's scratch, the Q/K/V projections ((Hq + 2 Hkv) D),
  // the SwiGLU output and its gradient, the gate/up gradient (4 ffn), a
  // norm's gradient (h); the attention server's stateless backward of one
  // layer: Q, dO, dQ (3 Hq D), K, V, dK, dV (4 Hkv D), LSE and delta (2 Hq).
  const auto per_nano_row = [](const ModelConfig& c) {
    return c.hidden + (c.q_heads + 2.0 * c.kv_heads) * c.head_dim() + 4.0 * c.ffn_hidden +
           (3.0 * c.q_heads + 4.0 * c.kv_heads) * c.head_dim() + 2.0 * c.q_heads;
  };
  const auto need_floats = [&](const ModelConfig& c, int64_t tokens) {
    return double(tokens) * (c.num_layers * kept(c) + outside(c)) + double(tokens / 2) * per_nano_row(c);
  };
  const double activations = 4.0 * (need_floats(m, t.tokens_per_rank) + double(t.tokens_per_rank) * m.vocab_size);
  t.memory_bytes = 2 * (state + activations) * (1 - 1e-9);  // just below: refused
  s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
  EXPECT_NE(s.message().find("2 rank(s) on this machine: "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("GB, more than memory_bytes"), std::string::npos) << s.message();
  t.memory_bytes = 2 * (state + activations) * (1 + 1e-9);  // just above: trains
  t.steps = 1;
  s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
  EXPECT_TRUE(s.ok()) << s.ToString();
  // Colocated attention runs one nano-batch of all the tokens, and the cached
  // backward keeps the servers' Q, K, V and LSE of every layer: both need more.
  for (const bool colocated : {true, false}) {
    TrainOptions c = t;
    if (colocated) c.attention = AttentionMode::kColocated;
    if (!colocated) c.backward = BackwardMode::kCached;
    s = RunLocal(2, [&](Comm& comm) { return Train(comm, c, nullptr); });
    EXPECT_NE(s.message().find("more than memory_bytes"), std::string::npos) << colocated << ": " << s.message();
  }
  // Saving a checkpoint adds kSaveBytesPerParameter while the step's buffers are held.
  t.save_dir = testing::ScratchDir("memory-save");
  s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
  EXPECT_NE(s.message().find("GB to write a checkpoint"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(t.save_dir));
  t.save_dir.clear();
  // With a vocabulary of 2^16, 512 tokens' logits (2^25 floats) are more
  // than one LM-head chunk (2^24): the check counts the chunk.
  {
    TrainOptions v = TinyTrainOptions(2);
    v.model.vocab_size = 1 << 16;
    v.steps = 1;
    const ModelConfig& w = v.model;
    const double held = 16.0 * double(ParameterCount(w)) + 4.0 * need_floats(w, v.tokens_per_rank) +
                        4.0 * double(ModelPass::kDefaultMaxLogitFloats);
    v.memory_bytes = 2 * held * (1 - 1e-9);
    s = RunLocal(2, [&](Comm& comm) { return Train(comm, v, nullptr); });
    EXPECT_NE(s.message().find("more than memory_bytes"), std::string::npos) << s.message();
    v.memory_bytes = 2 * held * (1 + 1e-9);
    s = RunLocal(2, [&](Comm& comm) { return Train(comm, v, nullptr); });
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  // Loading a checkpoint holds up to kLoadBytesPerParameter beyond the state
  // before the first step's activations: the check counts the larger.
  {
    TrainOptions l = TinyTrainOptions(2);
    l.tokens_per_rank = 128;
    l.data.batches.clear();
    l.data.spec = "synthetic:" + std::string(DISTCA_SOURCE_DIR) + "/data/doc-lengths-pretrain.json";
    l.load_dir = testing::ScratchDir("no-such-checkpoint");
    const double act = 4.0 * (need_floats(m, l.tokens_per_rank) + double(l.tokens_per_rank) * m.vocab_size);
    const double loading = double(kLoadBytesPerParameter) * double(ParameterCount(m));
    ASSERT_GT(loading, act);
    l.memory_bytes = 2 * (state + loading) * (1 - 1e-9);
    s = RunLocal(2, [&](Comm& comm) { return Train(comm, l, nullptr); });
    EXPECT_NE(s.message().find("for loading the checkpoint), 2 rank(s)"), std::string::npos) << s.message();
    l.memory_bytes = 2 * (state + loading) * (1 + 1e-9);  // passes the check, then finds no checkpoint
    s = RunLocal(2, [&](Comm& comm) { return Train(comm, l, nullptr); });
    EXPECT_NE(s.message().find("no such directory"), std::string::npos) << s.message();
  }
  // The memory check sizes the largest batch of a docs file, not its first.
  t.tokens_per_rank = 0;
  t.data.batches.push_back({2048, 2048});
  s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
  EXPECT_NE(s.message().find("more than memory_bytes"), std::string::npos) << s.message();
  // Tokens per rank x ranks past the data layer's limit (and past an int64).
  t = TinyTrainOptions(2);
  t.tokens_per_rank = int64_t{1} << 62;
  t.data.batches.clear();
  t.data.spec = "synthetic:" + std::string(DISTCA_SOURCE_DIR) + "/data/doc-lengths-pretrain.json";
  s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
  EXPECT_NE(s.message().find("above the limit of 4294967296 tokens per batch"), std::string::npos) << s.message();
}

// The data is read against the model's vocabulary: token ids up to 999 train
// a 1000-token vocabulary and are refused, naming the id, by a 500-token one.
TEST(TrainTest, IndexedDataUsesTheModelsVocabulary) {
  const std::string dir = testing::ScratchDir("indexed");
  std::filesystem::create_directories(dir);
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 16; ++d) {
    docs.emplace_back();
    for (int i = 0; i < 100; ++i) docs.back().push_back((d * 131 + i * 17) % 1000);
  }
  docs[3][5] = 999;
  ASSERT_TRUE(WriteIndexedDataset(dir + "/corpus", docs).ok());
  TrainOptions t = TinyTrainOptions(2);
  t.data.batches.clear();
  t.data.spec = "indexed:" + dir + "/corpus";
  t.tokens_per_rank = 128;
  t.steps = 2;
  t.model.vocab_size = 1000;
  Status s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
  EXPECT_TRUE(s.ok()) << s.ToString();
  t.model.vocab_size = 500;
  s = RunLocal(2, [&](Comm& comm) { return Train(comm, t, nullptr); });
  EXPECT_NE(s.message().find("outside [0, vocab size 500)"), std::string::npos) << s.message();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace distca
