// `trellis model-logits` (for reference checks): loads a checkpoint across every rank of
// the job as one tensor-parallel group (t = world size; no MPI needed at t = 1), prefills
// a batch of prompts of different lengths returning the logits of every prompt position,
// then runs teacher-forced decode steps (the given tokens, not sampled ones) returning the
// logits of each step. Rank 0 writes PREFIX.json (shapes) and PREFIX.f32 (the logits, row
// after row: prefill rows in prompt order, then each decode step's rows in sequence order).
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "trellis/runtime/engine/device.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/kernels/context.hpp"
#include "trellis/runtime/checkpoint/reader.hpp"
#include "trellis/runtime/model/llama.hpp"
#include "trellis/transport/collectives.hpp"

namespace trellis::launchers {
namespace {

struct LogitsOptions {
  std::string model;
  std::string prompts;  // "1,2,3;4,5"
  std::string decode;   // "7,8;9,10" (one list per prompt, equal lengths)
  std::string weights = "auto";
  std::string out;
};

std::vector<std::vector<std::int32_t>> parse_lists(const std::string& text, const char* what) {
  std::vector<std::vector<std::int32_t>> out;
  for (const auto& part : split(text, ';', true)) {
    auto& v = out.emplace_back();
    for (const auto& t : split(part, ',')) v.push_back(static_cast<std::int32_t>(parse_int(trim(t), what)));
  }
  return out;
}

std::unique_ptr<transport::Group> tp_group(Session& s) {
  if (s.size() == 1) return transport::make_single_group(0);
  std::vector<int> all(static_cast<std::size_t>(s.size()));
  for (int i = 0; i < s.size(); ++i) all[static_cast<std::size_t>(i)] = i;
  return transport::make_group(s.world(), all, transport::GroupOptions::from_config(s.config), s.config);
}

int run_logits(Session& s, const LogitsOptions& o) {
  auto prompts = parse_lists(o.prompts, "--prompts");
  auto decode = o.decode.empty() ? std::vector<std::vector<std::int32_t>>(prompts.size()) : parse_lists(o.decode, "--decode");
  if (decode.size() != prompts.size())
    throw_error(ErrorCode::kInvalidArgument, "--decode has {} lists but --prompts has {}", decode.size(), prompts.size());
  for (const auto& d : decode)
    if (d.size() != decode[0].size())
      throw_error(ErrorCode::kInvalidArgument, "--decode lists must all have the same length");
  auto reader = runtime::open_checkpoint(o.model);
  auto text = reader->config_json();
  if (!text) throw_error(ErrorCode::kNotFound, "{}: no config.json", reader->describe());
  auto cfg = runtime::parse_model_config(*text, reader->describe() + "/config.json");
  kernels::Context ctx = runtime::cpu_context(s.config);
  auto group = tp_group(s);
  runtime::LoadOptions lo;
  lo.max_slots = static_cast<int>(prompts.size());
  lo.max_seq_len = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i)
    lo.max_seq_len = std::max<std::int64_t>(lo.max_seq_len, static_cast<std::int64_t>(prompts[i].size() + decode[i].size()));
  lo.window_bytes = s.config.get_size("comm.coll_shm_window");
  if (o.weights != "auto") lo.weight_dtype = o.weights == "f32" ? runtime::ElemType::kF32 : runtime::ElemType::kBF16;
  runtime::LlamaModel model(*reader, cfg, *group, ctx, lo);

  runtime::Batch pre;
  pre.all_logits = true;
  std::vector<std::int64_t> pos;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    pre.tokens.insert(pre.tokens.end(), prompts[i].begin(), prompts[i].end());
    pre.seqs.push_back({static_cast<int>(i), 0, static_cast<std::int64_t>(prompts[i].size())});
    pos.push_back(static_cast<std::int64_t>(prompts[i].size()));
  }
  std::vector<float> all = model.forward(pre);
  nlohmann::json meta = {{"vocab", cfg.vocab_size}, {"tp", s.size()}, {"prefill_rows", pre.total_tokens()},
                         {"weights", std::string(runtime::to_string(model.weight_dtype()))}};
  for (std::size_t k = 0; k < decode[0].size(); ++k) {
    std::vector<std::int32_t> toks;
    for (const auto& d : decode) toks.push_back(d[k]);
    auto step = model.forward(runtime::Batch::decode(toks, pos));
    all.insert(all.end(), step.begin(), step.end());
    for (auto& p : pos) ++p;
  }
  meta["decode_steps"] = decode[0].size();
  meta["sequences"] = prompts.size();
  if (!s.is_root()) return 0;
  std::ofstream(o.out + ".f32", std::ios::binary)
      .write(reinterpret_cast<const char*>(all.data()), static_cast<std::streamsize>(all.size() * sizeof(float)));
  std::ofstream(o.out + ".json") << meta.dump(2) << "\n";
  std::cout << fmt::format("wrote {} logit rows of {} to {}.f32\n", all.size() / static_cast<std::size_t>(cfg.vocab_size),
                           cfg.vocab_size, o.out);
  return 0;
}

}  // namespace

Action define_model_logits(CLI::App& sub) {
  auto o = std::make_shared<LogitsOptions>();
  sub.add_option("--model", o->model, "Checkpoint directory or file")->required();
  sub.add_option("--prompts", o->prompts, "Token ids: comma-separated, prompts separated by ';'")->required();
  sub.add_option("--decode", o->decode, "Teacher-forced decode tokens per prompt, same syntax, equal lengths");
  sub.add_option("--weights", o->weights, "Weight type in memory: auto, f32, bf16")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}))->capture_default_str();
  sub.add_option("--out", o->out, "Output prefix (PREFIX.json, PREFIX.f32)")->required();
  return [o](Session& s) { return run_logits(s, *o); };
}

}  // namespace trellis::launchers
