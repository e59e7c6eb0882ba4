#include "trellis/runtime/scheduler/swift_control.hpp"

#include <algorithm>
#include <cmath>

#include "trellis/core/error.hpp"

namespace trellis::runtime {

double SwiftReport::optimisation_share() const {
  const double total = opt_s + draft_s + verify_s;
  return total > 0 ? opt_s / total : 0;
}

double SwiftReport::measured_speedup() const {
  const double t = draft_s + verify_s + opt_s;
  return t > 0 && plain_step_s > 0 ? plain_step_s * static_cast<double>(committed) / t : 0;
}

SwiftControl::SwiftControl(SwiftConfig cfg) : cfg_(std::move(cfg)) {
  swift::validate(cfg_.settings);
  if (cfg_.max_tree < 2 || cfg_.max_tree > 512)
    throw_error(ErrorCode::kInvalidArgument, "swift.max_tree must be in [2, 512] (got {})", cfg_.max_tree);
  if (cfg_.calibration_steps < 1 || cfg_.calibration_steps > 1000)
    throw_error(ErrorCode::kInvalidArgument, "swift.calibration_steps must be in [1, 1000] (got {})",
                cfg_.calibration_steps);
  if (cfg_.allowed) {
    opt_.emplace(cfg_.num_layers, cfg_.settings);
    rep_.sub_layers = 2 * cfg_.num_layers;
    ratio_ = cfg_.settings.skip_ratio;
  }
}

bool SwiftControl::wants(const Request& r) const {
  return cfg_.allowed && r.swift.value_or(cfg_.enabled) && !refusal(r);
}

std::optional<std::string> SwiftControl::refusal(const Request& r) const {
  if (!r.swift.value_or(cfg_.enabled)) return std::nullopt;
  if (!cfg_.invariant)
    return std::string("\"swift\": true needs --swift (or kernels.batch_invariant=true) so that a verified token gets "
                       "the logits plain decoding gives it; this one decodes plainly");
  if (r.sampling.has_penalties())
    return std::string("SWIFT does not draft requests with frequency, presence or repetition penalties (the "
                       "penalties of a draft token depend on the path it is on); this one decodes plainly");
  return std::nullopt;
}

int SwiftControl::scratch_positions() const { return std::max(cfg_.settings.gamma, cfg_.max_tree); }

bool SwiftControl::drafting(const SeqView& v, std::int32_t max_context) const {
  return opt_ && !rep_.turned_off && static_cast<int>(plain_samples_.size()) >= cfg_.calibration_steps &&
         v.next_token >= 0 && v.len + scratch_positions() <= max_context;
}

void SwiftControl::observe_plain(double round_trip_s, int tokens) {
  if (static_cast<int>(plain_samples_.size()) >= cfg_.calibration_steps || tokens < 1) return;
  plain_samples_.push_back(round_trip_s / tokens);
  ++rep_.plain_steps;
  auto v = plain_samples_;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  rep_.plain_step_s = v[v.size() / 2];
}

SwiftControl::Action SwiftControl::next_action(const SeqView& v, SeqState& st) const {
  const int gamma = cfg_.settings.gamma;
  // One optimisation step before each decoding step of the stream (a verify pass), not one
  // per sequence: the optimiser is the run's, and at batch B per-sequence steps would cost B
  // γ-token forwards per decoding step.
  if (st.steps.empty() && opt_due_ && !opt_->finished() && static_cast<int>(v.output->size()) > gamma &&
      v.len >= gamma)
    return Action::kOptimise;
  if (st.steps.empty()) return Action::kDraft;
  // The tree holds the root, the chain and alternatives: stop the chain well inside max_tree.
  const int drafted = static_cast<int>(st.steps.size());
  if (drafted + 1 < cfg_.max_tree && swift::keep_drafting(st.steps.back(), drafted, cfg_.settings))
    return Action::kDraft;
  return Action::kVerify;
}

void SwiftControl::add_seq(ScheduleOutput& s, const SeqView& v, SeqState& st, std::int32_t pos,
                           std::span<const std::int32_t> tokens) {
  ScheduledSeq q;
  q.id = v.id;
  q.slot = v.slot;
  q.column = v.column;
  q.pos = pos;
  q.n_tokens = static_cast<std::int32_t>(tokens.size());
  q.sample = false;
  q.candidates = true;
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  s.moves.insert(s.moves.end(), st.moves.begin(), st.moves.end());
  st.moves.clear();
  s.seqs.push_back(std::move(q));
}

bool SwiftControl::plan(std::span<const SeqView> seqs, ScheduleOutput& s, double now) {
  if (!opt_ || seqs.empty()) return false;
  if (t0_ < 0) t0_ = now;
  // The kind of the first sequence's next step decides the iteration; others of that kind join.
  Action kind = Action::kNone;
  for (const auto& v : seqs) {
    auto& st = seqs_[v.id];
    const Action a = next_action(v, st);
    if (kind == Action::kNone) kind = a;
    if (a != kind) continue;
    if (a == Action::kOptimise) {
      // One candidate per step: score it on this sequence's last γ committed tokens, read
      // through a tree-shaped chain whose K/V go past the sequence (positions len..len+γ-1).
      const int gamma = cfg_.settings.gamma;
      const std::int32_t first = v.len - gamma;
      std::vector<std::int32_t> toks;
      const auto& p = *v.prompt;
      const auto& o = *v.output;
      for (std::int32_t i = first; i < v.len; ++i) {
        const auto pi = static_cast<std::size_t>(i);
        toks.push_back(pi < p.size() ? p[pi] : o[pi - p.size()]);
      }
      st.candidate = opt_->propose();
      opt_due_ = false;
      st.opt_last = v.next_token;
      add_seq(s, v, st, first, toks);
      auto& q = s.seqs.back();
      q.kv_pos = v.len;
      q.prefix = first;
      q.parents.resize(static_cast<std::size_t>(gamma));
      for (int i = 0; i < gamma; ++i) q.parents[static_cast<std::size_t>(i)] = i - 1;
      s.skip = st.candidate;
      break;  // one optimisation step per iteration
    }
    if (a == Action::kDraft) {
      const auto j = static_cast<std::int32_t>(st.steps.size());
      const std::int32_t tok = j == 0 ? v.next_token : st.steps.back().top[0].token;
      add_seq(s, v, st, v.len + j, std::span(&tok, 1));
      s.skip = opt_->best();
      continue;
    }
    // Verify: the tree, truncated to max_tree (alternatives come last, so a prefix of the
    // layout is still a tree).
    st.tree = swift::build_tree(v.next_token, st.steps);
    if (st.tree.size() > cfg_.max_tree) {
      st.tree.tokens.resize(static_cast<std::size_t>(cfg_.max_tree));
      st.tree.parents.resize(static_cast<std::size_t>(cfg_.max_tree));
      st.tree.depth.resize(static_cast<std::size_t>(cfg_.max_tree));
    }
    add_seq(s, v, st, v.len, st.tree.tokens);
    auto& q = s.seqs.back();
    q.parents = st.tree.parents;
    q.kv_pos = v.len;
    q.prefix = v.len;
  }
  return kind != Action::kNone && !s.seqs.empty();
}

std::vector<SwiftControl::Commit> SwiftControl::complete(const ScheduleOutput& s,
                                                         std::span<const std::int32_t> cand_tokens,
                                                         std::span<const float> cand_probs, double round_trip_s,
                                                         double now) {
  constexpr int K = 10;  // detail::kSwiftTopK: candidates per row
  const int rows = s.logit_rows();
  if (cand_tokens.size() != static_cast<std::size_t>(rows) * K || cand_probs.size() != cand_tokens.size())
    throw_error(ErrorCode::kInternal, "swift: iteration {} has {} logits rows but {} candidates came back", s.iteration,
                rows, cand_tokens.size());
  const bool optimising = !s.skip.empty() && !s.seqs.empty() && !s.seqs[0].parents.empty();
  const bool drafting = !s.skip.empty() && !optimising;
  (optimising ? rep_.opt_s : drafting ? rep_.draft_s : rep_.verify_s) += round_trip_s;
  win_time_ += round_trip_s;
  if (!optimising) win_accel_time_ += round_trip_s;
  // Communication saved (issue 16: count it): every skipped sub-layer of a draft or scoring
  // forward is one all-reduce its stage's TP group did not do, once per iteration.
  if (!s.skip.empty()) {
    const int skipped = swift::count_skipped(s.skip);
    rep_.sublayers_skipped += skipped;
    if (cfg_.tp > 1) rep_.reductions_saved += skipped;
  }
  std::vector<Commit> out;
  std::size_t row = 0;
  for (const auto& q : s.seqs) {
    const std::size_t base = row;
    row += static_cast<std::size_t>(q.n_tokens);
    auto it = seqs_.find(q.id);
    if (it == seqs_.end()) continue;  // dropped while in flight
    SeqState& st = it->second;
    const auto top1 = [&](std::size_t r) { return cand_tokens[r * K]; };
    if (optimising) {
      // Eq. (4): the draft's greedy prediction after window token i against the committed
      // token that followed it (the last one is the sequence's pending next token).
      int match = 0;
      for (std::int32_t i = 0; i < q.n_tokens; ++i) {
        const auto want = i + 1 < q.n_tokens ? s.tokens[base + static_cast<std::size_t>(i + 1)] : st.opt_last;
        match += top1(base + static_cast<std::size_t>(i)) == want ? 1 : 0;
      }
      const double m = static_cast<double>(match) / static_cast<double>(q.n_tokens);
      const bool was_running = !opt_->finished();
      opt_->report(st.candidate, m);
      ++rep_.opt_steps;
      rep_.timeline.push_back({now - t0_, opt_->best_matchness(), 0});
      if (was_running && opt_->finished())
        notes_.push_back(fmt::format("swift: optimisation finished after {} steps ({}); skip set {} ({} of {} "
                                     "sub-layers), matchness {:.3f}", opt_->steps(), opt_->stop_reason(),
                                     swift::describe(opt_->best()), swift::count_skipped(opt_->best()),
                                     2 * cfg_.num_layers, opt_->best_matchness()));
      continue;
    }
    if (drafting) {
      swift::DraftStep step;
      for (int k = 0; k < K; ++k) {
        const auto t = cand_tokens[base * K + static_cast<std::size_t>(k)];
        if (t >= 0) step.top.push_back({t, cand_probs[base * K + static_cast<std::size_t>(k)]});
      }
      if (step.top.empty()) throw_error(ErrorCode::kInternal, "swift: a draft row of iteration {} has no candidates",
                                        s.iteration);
      st.steps.push_back(std::move(step));
      continue;
    }
    // Verify: the target's greedy next token after every node.
    std::vector<std::int32_t> target(static_cast<std::size_t>(q.n_tokens));
    for (std::int32_t i = 0; i < q.n_tokens; ++i) target[static_cast<std::size_t>(i)] = top1(base + static_cast<std::size_t>(i));
    const auto acc = swift::accept_greedy(st.tree, target);
    // Move an accepted alternative (always a leaf: at most one, at the end) into its place.
    for (std::size_t d = 0; d < acc.nodes.size(); ++d) {
      const auto node = acc.nodes[d];
      const auto depth = static_cast<std::int32_t>(d + 1);
      if (node != depth) {
        st.moves.push_back(KvCopy{q.slot, q.pos + node, q.pos + depth, 1});
        ++rep_.alternatives;
      }
    }
    const auto drafted = static_cast<std::int64_t>(st.steps.size());
    rep_.draft_steps += drafted;
    rep_.accepted += static_cast<std::int64_t>(acc.nodes.size());
    ++rep_.verify_passes;
    rep_.committed += static_cast<std::int64_t>(acc.tokens.size());
    win_drafts_ += drafted;
    win_accepted_ += static_cast<std::int64_t>(acc.nodes.size());
    win_tokens_ += static_cast<std::int64_t>(acc.tokens.size());
    st.steps.clear();
    opt_due_ = true;
    out.push_back(Commit{q.id, acc.tokens, static_cast<std::int32_t>(1 + acc.nodes.size())});
  }
  if (!optimising && !drafting && !out.empty()) {
    // Instance speedup of this verify's cycle is not separable per sequence in a batch; the
    // series uses the running measurement.
    rep_.timeline.push_back({now - t0_, opt_->best_matchness(), rep_.measured_speedup()});
    judge(now);
  }
  return out;
}

// The paper's footnote 3: a draft that skips this much is too unlike the target for the
// search to find a set it accepts, so the search continues with fewer skipped sub-layers.
void SwiftControl::lower_ratio(double alpha) {
  const auto& set = cfg_.settings;
  const int sub_layers = 2 * cfg_.num_layers;
  // Steps too small to change the whole number of skipped sub-layers add up until one does.
  double next = ratio_;
  int budget = opt_->budget();
  while (budget >= opt_->budget()) {
    next -= set.ratio_step;
    if (next < set.min_skip_ratio - 1e-9) return;
    budget = static_cast<int>(std::lround(next * sub_layers));
  }
  if (budget < 1) return;
  notes_.push_back(fmt::format("swift: acceptance {:.2f} over the last {} drafts is below {:.2f} while optimising: "
                               "skip ratio {:.2f} -> {:.2f} ({} -> {} of {} sub-layers)",
                               alpha, win_drafts_, set.ratio_tolerance, ratio_, next, opt_->budget(), budget,
                               sub_layers));
  opt_->set_budget(budget);
  ratio_ = std::round(next * 1e6) / 1e6;  // 0.55, not 0.5499999999999998, in the report
  ++rep_.ratio_lowered;
}

void SwiftControl::judge(double) {
  const auto& set = cfg_.settings;
  // Re-enter optimisation when acceptance falls (e.g. the stream changed domain).
  if (win_drafts_ >= set.acceptance_window) {
    const double alpha = static_cast<double>(win_accepted_) / static_cast<double>(win_drafts_);
    if (opt_->finished() && alpha < set.reenter_acceptance) {
      opt_->restart();
      ++rep_.restarts;
      notes_.push_back(fmt::format("swift: acceptance {:.2f} over the last {} drafts is below {:.2f}: optimising the "
                                   "skip set again", alpha, win_drafts_, set.reenter_acceptance));
    } else if (!opt_->finished() && alpha < set.ratio_tolerance) {
      lower_ratio(alpha);
    }
    win_drafts_ = win_accepted_ = 0;
  }
  // Auto-off. Over each window of committed tokens: the speedup counting every SWIFT
  // iteration (optimisation included) and the one of drafting and verifying alone (what the
  // current skip set delivers). Below the threshold with optimisation over, drafting stops;
  // while it still runs, only when drafting itself does not pay either (then the
  // optimisation is not an investment that can be recovered).
  //
  // An early look after an eighth of the window (at least 16 tokens) turns it off at once
  // when drafting and verifying alone reach less than 3/4 of the threshold: far enough
  // below that noise cannot explain it, and where a stream would otherwise lose most of a
  // window. (At 1/2, a task whose drafting ran at 0.5-0.6x kept optimising for a whole
  // window and lost 13%. An unoptimised skip set on hardware where SWIFT pays sits near 1x
  // by Eq. (6) — the paper's initial matchness 0.45 at r 0.5 gives 0.97x — above it.)
  // The look comes sooner, at kEarlyMinTokens, once the SWIFT iterations have taken as long
  // as plain decoding would for those 16: where almost nothing is accepted, a cycle costs a
  // draft and a verify pass over a wide tree for one token (SmolLM2 at r = 0.5 on 2 CPU
  // cores: ~3 plain steps), and waiting for 16 tokens lost 3x more time than the look at 5-6
  // (docs/swift.md, "The early look bounded by time").
  constexpr double kEarly = 0.75;
  constexpr std::int64_t kEarlyMinTokens = 4;
  const std::int64_t early_tokens = std::max<std::int64_t>(16, set.speedup_window / 8);
  const bool full = win_tokens_ >= set.speedup_window;
  const bool early = !early_done_ && win_tokens_ >= kEarlyMinTokens &&
                     (win_tokens_ >= early_tokens || win_time_ >= rep_.plain_step_s * static_cast<double>(early_tokens));
  if (full || early) {
    const double plain = rep_.plain_step_s * static_cast<double>(win_tokens_);
    const double overall = win_time_ > 0 ? plain / win_time_ : 0;
    const double accel = win_accel_time_ > 0 ? plain / win_accel_time_ : 0;
    const bool off = full ? overall < set.min_speedup && (opt_->finished() || accel < set.min_speedup)
                          : accel < kEarly * set.min_speedup;
    early_done_ = true;
    if (!rep_.turned_off && off) {
      rep_.turned_off = true;
      rep_.off_reason = fmt::format("measured speedup {:.2f}x ({:.2f}x drafting and verifying alone) over {} tokens "
                                    "is below {:.2f}x{}", overall, accel, win_tokens_,
                                    full ? set.min_speedup : kEarly * set.min_speedup, full ? "" : " (early check)");
      notes_.push_back(fmt::format("swift: drafting turned off for this stream: {} (plain {:.2f} ms per token)",
                                   rep_.off_reason, 1e3 * rep_.plain_step_s));
    }
    if (!full) return;
    win_tokens_ = 0;
    win_time_ = 0;
    win_accel_time_ = 0;
  }
}

std::vector<KvCopy> SwiftControl::take_moves(std::int64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return {};
  std::vector<KvCopy> out;
  out.swap(it->second.moves);
  return out;
}

std::vector<std::string> SwiftControl::take_notes() {
  std::vector<std::string> out;
  out.swap(notes_);
  return out;
}

SwiftReport SwiftControl::report() const {
  SwiftReport r = rep_;
  if (opt_) {
    r.skip_set = swift::describe(opt_->best());
    r.skipped = swift::count_skipped(opt_->best());
    r.best_matchness = opt_->best_matchness();
    r.stop_reason = opt_->stop_reason();
    r.skip_ratio = ratio_;
  }
  return r;
}

}  // namespace trellis::runtime
