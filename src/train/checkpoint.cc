// Checkpoints and the safetensors format (include/distca/train.h,
// docs/checkpoint_format.md).
#include <fmt/format.h>

#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/excerpt.h"
#include "common/file_util.h"
#include "common/json_text.h"
#include "distca/train.h"

namespace distca {
namespace {

namespace fs = std::filesystem;

// The file in a checkpoint directory that names its newest step directory.
constexpr const char* kLatestFile = "latest";
// A step directory's files.
constexpr const char* kStateFile = "state.json";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
using nlohmann::json;

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

// 2: state.json records the learning-rate schedule.
constexpr const char* kFormat = "distca-checkpoint-2";
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;  // the safetensors spec's limit

std::string StepDirName(int64_t step) { return fmt::format("step-{:08d}", step); }

// state.json's whole numbers: JSON's 1.5, true or "2" are refused rather
// than truncated or converted, and negative ones (a seed of -1 would wrap).
template <class T>
Status ReadCount(const json& object, const char* key, const std::string& where, T* out) {
  const auto it = object.find(key);
  if (it == object.end()) return Status::InvalidArgument(fmt::format("{}/state.json lacks '{}'", where, key));
  if (!it->is_number_unsigned() || it->get<uint64_t>() > uint64_t(std::numeric_limits<T>::max()))
    return Status::InvalidArgument(
        fmt::format("{}/state.json: '{}' must be a whole number >= 0, got {}", where, key, it->dump()));
  *out = static_cast<T>(it->get<uint64_t>());
  return Status::Ok();
}

json ConfigJson(const ModelConfig& c) {
  return {{"vocab_size", c.vocab_size}, {"num_layers", c.num_layers}, {"hidden", c.hidden},
          {"q_heads", c.q_heads},       {"kv_heads", c.kv_heads},     {"ffn_hidden", c.ffn_hidden},
          {"rope_theta", c.rope_theta}, {"norm_eps", c.norm_eps}};
}

// The tensors of a flat buffer laid out as `layout`, under a name prefix.
std::vector<NamedTensor> Tensors(const std::vector<ParamTensor>& layout, const float* base, const std::string& prefix) {
  std::vector<NamedTensor> out;
  for (const ParamTensor& t : layout) out.push_back({prefix + t.name, t.shape, base + t.offset});
  return out;
}

// Checks that `file` holds exactly the tensors named prefix + a layout name,
// for each of `prefixes`, each of the layout's shape, and that its metadata
// names `step`.
Status CheckTensors(const SafetensorsFile& file, const std::vector<ParamTensor>& layout,
                    const std::vector<std::string>& prefixes, int64_t step, const std::string& path) {
  if (file.tensors.size() != layout.size() * prefixes.size())
    return Status::InvalidArgument(fmt::format("{} holds {} tensors, the model needs {}: written for another model",
                                               path, file.tensors.size(), layout.size() * prefixes.size()));
  for (const std::string& prefix : prefixes)
    for (const ParamTensor& t : layout) {
      const SafetensorsFile::Entry* e = file.Find(prefix + t.name);
      if (e == nullptr) return Status::InvalidArgument(fmt::format("{} has no tensor '{}'", path, prefix + t.name));
      if (e->shape != t.shape)
        return Status::InvalidArgument(fmt::format("{}: tensor '{}' has shape {}, the model needs {}", path,
                                                   prefix + t.name, json(e->shape).dump(), json(t.shape).dump()));
    }
  bool step_ok = false;
  for (const auto& [k, val] : file.metadata) step_ok |= (k == "step" && val == std::to_string(step));
  if (!step_ok) return Status::InvalidArgument(fmt::format("{}: not from step {} of state.json", path, step));
  return Status::Ok();
}

// SaveCheckpoint writes finite values only, and second moments (squares)
// are never negative: anything else is a corrupt file, refused by name
// rather than left to surface steps later as a non-finite loss.
Status CheckTensorValues(const SafetensorsFile& file, const std::string& path) {
  for (const auto& [name, e] : file.tensors) {
    const bool second_moment = name.rfind("v.", 0) == 0;
    for (size_t i = 0; i < e.values.size(); ++i) {
      const float x = e.values[i];
      if (!std::isfinite(x) || (second_moment && x < 0))
        return Status::InvalidArgument(fmt::format("{}: tensor '{}' holds {} at element {}{}: a corrupt checkpoint",
                                                   path, name, x, i,
                                                   second_moment ? " (second moments are >= 0)" : ""));
    }
  }
  return Status::Ok();
}

// Copies the tensors named prefix + layout names (checked by CheckTensors)
// into a flat buffer.
void CopyTensors(const SafetensorsFile& file, const std::vector<ParamTensor>& layout, const std::string& prefix,
                 float* dst) {
  for (const ParamTensor& t : layout)
    std::memcpy(dst + t.offset, file.Find(prefix + t.name)->values.data(), sizeof(float) * size_t(t.size));
}

}  // namespace

const SafetensorsFile::Entry* SafetensorsFile::Find(const std::string& name) const {
  for (const auto& [n, e] : tensors)
    if (n == name) return &e;
  return nullptr;
}

Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                        const std::vector<std::pair<std::string, std::string>>& metadata) {
  json header = json::object();
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const uint64_t bytes = uint64_t(n) * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) {
    json meta = json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  std::string head = header.dump();
  head.resize((head.size() + 7) / 8 * 8, ' ');  // the data starts 8-byte aligned
  std::string bytes(8 + head.size() + offset, '\0');
  const uint64_t head_size = head.size();
  std::memcpy(bytes.data(), &head_size, 8);
  std::memcpy(bytes.data() + 8, head.data(), head.size());
  char* data = bytes.data() + 8 + head.size();
  for (const NamedTensor& t : tensors) {
    const auto& offsets = header[t.name]["data_offsets"];
    const uint64_t begin = offsets[0], end = offsets[1];
    if (end > begin) std::memcpy(data + begin, t.data, end - begin);
  }
  return WriteFileAtomic(path, bytes);
}

Status ReadSafetensors(const std::string& path, SafetensorsFile* file, uint64_t max_data_bytes) {
  // A file larger than the header and the model's tensors (a 20 GB one, or
  // /dev/zero) is refused before it is read whole into memory.
  const uint64_t max_bytes = 8 + kMaxHeaderBytes + std::min(max_data_bytes, uint64_t{1} << 62);
  std::string bytes;
  DISTCA_RETURN_IF_ERROR(ReadBinaryFileAtMost(path, &bytes, max_bytes, "a header and this model's tensors"));
  if (bytes.size() < 8) return Status::InvalidArgument(path + ": too short for a safetensors header");
  uint64_t head_size = 0;
  std::memcpy(&head_size, bytes.data(), 8);
  if (head_size > kMaxHeaderBytes || head_size > bytes.size() - 8)
    return Status::InvalidArgument(
        fmt::format("{}: header size {} does not fit the file ({} bytes)", path, head_size, bytes.size()));
  json header;
  DISTCA_RETURN_IF_ERROR(ParseJsonText(std::string_view(bytes).substr(8, head_size), path + ": header", &header));
  if (!header.is_object()) return Status::InvalidArgument(path + ": header is not a JSON object");
  const uint64_t data_size = bytes.size() - 8 - head_size;
  const char* data = bytes.data() + 8 + head_size;
  SafetensorsFile result;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Status::InvalidArgument(path + ": __metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) return Status::InvalidArgument(path + ": __metadata__ values must be strings");
        result.metadata.emplace_back(k, v.get<std::string>());
      }
      continue;
    }
    const std::string where = fmt::format("{}: tensor '{}'", path, name);
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      return Status::InvalidArgument(where + " lacks dtype, shape or data_offsets");
    if (entry["dtype"] != "F32")
      return Status::InvalidArgument(
          fmt::format("{} has dtype {}; only F32 is supported", where, entry["dtype"].dump()));
    if (!entry["shape"].is_array()) return Status::InvalidArgument(where + ": shape is not an array");
    SafetensorsFile::Entry e;
    // The element count, bounded by the file's data (a shape whose product
    // overflows, or outgrows the file, is refused before anything is
    // allocated).
    const uint64_t max_count = data_size / sizeof(float);
    uint64_t count = 1;
    bool too_large = false;
    for (const json& d : entry["shape"]) {
      if (!d.is_number_unsigned())
        return Status::InvalidArgument(where + ": shape entries must be non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > uint64_t(std::numeric_limits<int64_t>::max()))
        return Status::InvalidArgument(fmt::format("{}: shape entry {} is too large", where, dim));
      e.shape.push_back(static_cast<int64_t>(dim));
      if (dim == 0) {
        count = 0;
      } else if (count != 0 && (too_large || count > max_count / dim)) {
        too_large = true;
      } else {
        count *= dim;
      }
    }
    if (too_large && count != 0)
      return Status::InvalidArgument(
          fmt::format("{}: its shape holds more elements than the file's {} data bytes", where, data_size));
    const json& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return Status::InvalidArgument(where + ": data_offsets must be two non-negative integers");
    const uint64_t begin = off[0], end = off[1];
    if (begin > end || end > data_size || end - begin != count * sizeof(float))
      return Status::InvalidArgument(
          fmt::format("{}: data_offsets [{}, {}) do not match its shape or the file's {} data bytes", where, begin, end,
                      data_size));
    e.values.resize(count);
    if (count > 0) std::memcpy(e.values.data(), data + begin, end - begin);
    ranges.emplace_back(begin, end);
    result.tensors.emplace_back(name, std::move(e));
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (const auto& [b, e] : ranges) {
    if (b != covered) return Status::InvalidArgument(path + ": tensor data overlaps or leaves gaps");
    covered = e;
  }
  if (covered != data_size)
    return Status::InvalidArgument(fmt::format("{}: {} data bytes but tensors cover {}", path, data_size, covered));
  *file = std::move(result);
  return Status::Ok();
}

Status SaveCheckpoint(const std::string& dir, const Transformer& model, const AdamW& optimizer,
                      const TrainState& state) {
  // A checkpoint of non-finite values could only poison a resumed run.
  const std::vector<ParamTensor>& tensors = model.tensors();
  for (const auto& [what, base] : {std::pair<const char*, const float*>{"weights", model.params()},
                                   {"first moments", optimizer.m().data()},
                                   {"second moments", optimizer.v().data()}}) {
    for (const ParamTensor& t : tensors)
      for (int64_t i = 0; i < t.size; ++i)
        if (!std::isfinite(base[t.offset + i]))
          return Status::FailedPrecondition(
              fmt::format("step {}: {} of '{}' are not finite (lower --lr?); "
                          "no checkpoint written",
                          state.step, what, t.name));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IoError(fmt::format("cannot create checkpoint directory '{}': {}", dir, ec.message()));
  const std::string name = StepDirName(state.step);
  const fs::path tmp = fs::path(dir) / (name + ".tmp"), final_dir = fs::path(dir) / name;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return Status::IoError(fmt::format("cannot create '{}': {}", tmp.string(), ec.message()));

  const std::vector<ParamTensor>& layout = model.tensors();
  const std::string step = std::to_string(state.step);
  DISTCA_RETURN_IF_ERROR(WriteSafetensors((tmp / kModelFile).string(), Tensors(layout, model.params(), ""),
                                          {{"format", kFormat}, {"step", step}}));
  std::vector<NamedTensor> moments = Tensors(layout, optimizer.m().data(), "m.");
  for (NamedTensor& t : Tensors(layout, optimizer.v().data(), "v.")) moments.push_back(t);
  DISTCA_RETURN_IF_ERROR(
      WriteSafetensors((tmp / kOptimizerFile).string(), moments, {{"format", kFormat}, {"step", step}}));
  const json j = {{"format", kFormat},
                  {"step", state.step},
                  {"seed", state.seed},
                  {"optimizer_step", optimizer.step()},
                  {"data",
                   {{"step", state.data.step},
                    {"epoch", state.data.epoch},
                    {"cursor", state.data.cursor},
                    {"offset", state.data.offset}}},
                  {"schedule",
                   {{"lr", state.schedule.lr},
                    {"min_lr", state.schedule.min_lr},
                    {"warmup_steps", state.schedule.warmup_steps},
                    {"decay_steps", state.schedule.decay_steps}}},
                  {"model", ConfigJson(model.config())},
                  {"parameters", model.size()}};
  DISTCA_RETURN_IF_ERROR(WriteFileAtomic((tmp / kStateFile).string(), j.dump(2) + "\n"));
  DISTCA_RETURN_IF_ERROR(SyncDirectory(tmp.string()));
  // A step saved again (a rerun into the same directory) swaps the new
  // directory in atomically, so that a crash leaves the old one or the new
  // one under its name, never neither; the old one then goes. Where the
  // file system cannot swap, the old one is removed first.
  bool swapped = false;
  if (fs::exists(final_dir, ec)) {
    swapped = renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0;
    if (swapped)
      fs::remove_all(tmp, ec);
    else
      fs::remove_all(final_dir, ec);
  }
  ec.clear();
  if (!swapped) fs::rename(tmp, final_dir, ec);
  if (ec)
    return Status::IoError(
        fmt::format("cannot rename '{}' to '{}': {}", tmp.string(), final_dir.string(), ec.message()));
  DISTCA_RETURN_IF_ERROR(SyncDirectory(dir));
  return WriteFileAtomic((fs::path(dir) / kLatestFile).string(), name + "\n");
}

bool IsCheckpointFile(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  return name == kStateFile || name == kModelFile || name == kOptimizerFile || name == kLatestFile;
}

Status CheckCheckpointDirectory(const std::string& dir) {
  DISTCA_RETURN_IF_ERROR(CheckOutputDirectory(dir, "checkpoint directory"));
  const std::string latest = (fs::path(dir) / kLatestFile).string();
  for (const std::string& path : {latest, StagingPathOf(latest)}) {
    std::error_code ec;
    if (fs::is_directory(path, ec))
      return Status::IoError(fmt::format("cannot write checkpoints to '{}': '{}' is a directory", dir, path));
  }
  return Status::Ok();
}

Status LoadCheckpoint(const std::string& dir, Transformer* model, AdamW* optimizer, TrainState* state) {
  fs::path ckpt = dir;
  std::error_code ec;
  if (!fs::is_directory(ckpt, ec)) return Status::InvalidArgument(fmt::format("--load {}: no such directory", dir));
  if (!fs::exists(ckpt / kStateFile)) {
    // `latest` names one step directory on one short line ("step-00000002"
    // and a newline, as SaveCheckpoint writes it): a larger file is not read.
    constexpr size_t kMaxLatestBytes = 4096;
    const fs::path latest_path = ckpt / kLatestFile;
    if (fs::is_regular_file(latest_path, ec) && fs::file_size(latest_path, ec) > kMaxLatestBytes)
      return Status::InvalidArgument(fmt::format(
          "{}/latest is malformed: over {} bytes, where it names one step directory", dir, kMaxLatestBytes));
    std::string latest;
    Status s = ReadTextFile(latest_path.string(), &latest, kMaxLatestBytes);
    if (!s.ok())
      return Status::InvalidArgument(fmt::format("--load {}: neither state.json nor a 'latest' file is there", dir));
    while (!latest.empty() && (latest.back() == '\n' || latest.back() == ' ')) latest.pop_back();
    // A plain directory name: letters, digits, '.', '_' and '-', not "." or "..".
    const bool plain = std::all_of(latest.begin(), latest.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    });
    if (latest.empty() || !plain || latest == "." || latest == "..")
      return Status::InvalidArgument(
          fmt::format("{}/latest is malformed: it must name one step directory (letters, digits, '.', '_', '-')", dir));
    ckpt /= latest;
  }
  const std::string where = ckpt.string();
  std::string text;
  // A state file is a few hundred bytes.
  constexpr uint64_t kMaxStateBytes = 1 << 20;
  DISTCA_RETURN_IF_ERROR(ReadTextFileAtMost((ckpt / kStateFile).string(), &text, kMaxStateBytes, "a state file"));
  json j;
  TrainState st;
  int64_t optimizer_step = 0;
  DISTCA_RETURN_IF_ERROR(ParseJsonText(text, where + "/state.json", &j));
  try {
    if (!j.is_object() || j.value("format", "") != kFormat)
      return Status::InvalidArgument(fmt::format("{}/state.json: format is not '{}'", where, kFormat));
    if (const json mine = ConfigJson(model->config()); j.at("model") != mine) {
      // Name the fields that differ first: the objects are long.
      std::string differ;
      const json& theirs = j.at("model");
      for (const auto& [key, value] : mine.items())
        if (!theirs.is_object() || !theirs.contains(key) || theirs[key] != value)
          differ += fmt::format("{}{} {} here, {} there", differ.empty() ? "" : "; ", key, value.dump(),
                                theirs.is_object() && theirs.contains(key) ? theirs[key].dump() : "none");
      return Status::InvalidArgument(fmt::format("{} was written for another model: {}", where,
                                                 differ.empty() ? "model " + Excerpt(theirs.dump(), 300) : differ));
    }
    DISTCA_RETURN_IF_ERROR(ReadCount(j, "step", where, &st.step));
    DISTCA_RETURN_IF_ERROR(ReadCount(j, "seed", where, &st.seed));
    DISTCA_RETURN_IF_ERROR(ReadCount(j, "optimizer_step", where, &optimizer_step));
    const json& d = j.at("data");
    if (!d.is_object()) return Status::InvalidArgument(fmt::format("{}/state.json: 'data' is not an object", where));
    DISTCA_RETURN_IF_ERROR(ReadCount(d, "step", where, &st.data.step));
    DISTCA_RETURN_IF_ERROR(ReadCount(d, "epoch", where, &st.data.epoch));
    DISTCA_RETURN_IF_ERROR(ReadCount(d, "cursor", where, &st.data.cursor));
    DISTCA_RETURN_IF_ERROR(ReadCount(d, "offset", where, &st.data.offset));
    const json& s = j.at("schedule");
    if (!s.is_object() || !s.at("lr").is_number() || !s.at("min_lr").is_number())
      return Status::InvalidArgument(fmt::format("{}/state.json: 'schedule' lacks numbers lr and min_lr", where));
    st.schedule.lr = s.at("lr").get<float>();
    st.schedule.min_lr = s.at("min_lr").get<float>();
    DISTCA_RETURN_IF_ERROR(ReadCount(s, "warmup_steps", where, &st.schedule.warmup_steps));
    DISTCA_RETURN_IF_ERROR(ReadCount(s, "decay_steps", where, &st.schedule.decay_steps));
  } catch (const json::exception& e) {
    return Status::InvalidArgument(fmt::format("{}/state.json is malformed: {}", where, JsonExceptionWhy(e)));
  }
  // The trainer steps the optimizer once per step: its bias correction
  // counts the same steps.
  if (optimizer_step != st.step)
    return Status::InvalidArgument(
        fmt::format("{}/state.json: optimizer_step {} is not the step {}", where, optimizer_step, st.step));
  // One batch per step: the data stream is as far along as the steps.
  if (st.data.step != st.step)
    return Status::InvalidArgument(
        fmt::format("{}/state.json: data step {} is not the step {}", where, st.data.step, st.step));

  // Everything is read and checked before the model or the optimizer is
  // touched; then the tensors are copied straight into them. The moments go
  // first, so that loading holds at most 16 bytes per parameter beyond the
  // model and optimizer (reading a file holds it twice: its bytes and its
  // tensors), which the memory check counts (kLoadBytesPerParameter).
  const std::vector<ParamTensor>& layout = model->tensors();
  if (optimizer->m().size() != size_t(model->size()) || optimizer->v().size() != size_t(model->size()))
    return Status::InvalidArgument("LoadCheckpoint: the optimizer is not this model's");
  SafetensorsFile moments, weights;
  const std::string moments_path = where + "/optimizer.safetensors", weights_path = where + "/model.safetensors";
  const uint64_t tensor_bytes = uint64_t(model->size()) * sizeof(float);
  DISTCA_RETURN_IF_ERROR(ReadSafetensors((ckpt / kOptimizerFile).string(), &moments, 2 * tensor_bytes));
  DISTCA_RETURN_IF_ERROR(CheckTensors(moments, layout, {"m.", "v."}, st.step, moments_path));
  DISTCA_RETURN_IF_ERROR(CheckTensorValues(moments, moments_path));
  DISTCA_RETURN_IF_ERROR(ReadSafetensors((ckpt / kModelFile).string(), &weights, tensor_bytes));
  DISTCA_RETURN_IF_ERROR(CheckTensors(weights, layout, {""}, st.step, weights_path));
  DISTCA_RETURN_IF_ERROR(CheckTensorValues(weights, weights_path));
  CopyTensors(weights, layout, "", model->params());
  CopyTensors(moments, layout, "m.", optimizer->m().data());
  CopyTensors(moments, layout, "v.", optimizer->v().data());
  optimizer->set_step(optimizer_step);
  *state = st;
  return Status::Ok();
}

}  // namespace distca
