// The model flags distca-train and distca-sim share: a preset and the
// Megatron-named overrides of its shape.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <utility>

#include "common/cli_checks.h"
#include "distca/model.h"
#include "distca/status.h"

namespace distca::cli {

struct ModelFlags {
  explicit ModelFlags(std::string default_preset) : preset(std::move(default_preset)) {}

  std::string preset;
  std::optional<int> num_layers, hidden, heads, groups, ffn, vocab;

  // --model (help: preset_help) and the overrides; vocab_help describes
  // --vocab-size.
  void Add(CLI::App& app, const std::string& preset_help, const std::string& vocab_help) {
    app.add_option("--model", preset, preset_help);
    app.add_option("--num-layers", num_layers, "override the preset's layers")->check(kPositive);
    app.add_option("--hidden-size", hidden, "override the hidden size")->check(kPositive);
    app.add_option("--num-attention-heads", heads, "override the query heads")->check(kPositive);
    app.add_option("--num-query-groups", groups, "override the KV heads (GQA groups)")->check(kPositive);
    app.add_option("--ffn-hidden-size", ffn, "override the MLP width")->check(kPositive);
    app.add_option("--vocab-size", vocab, vocab_help)->check(kPositive);
  }

  // The preset with the overrides given (not validated: ValidateModelConfig).
  Status Resolve(ModelConfig* model) const {
    DISTCA_RETURN_IF_ERROR(ModelPreset(preset, model));
    if (num_layers) model->num_layers = *num_layers;
    if (hidden) model->hidden = *hidden;
    if (heads) model->q_heads = *heads;
    if (groups) model->kv_heads = *groups;
    if (ffn) model->ffn_hidden = *ffn;
    if (vocab) model->vocab_size = *vocab;
    return Status::Ok();
  }
};

}  // namespace distca::cli
