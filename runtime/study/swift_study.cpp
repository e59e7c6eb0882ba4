// The SWIFT study's comparison and formats (swift_study.hpp). The Figure 6 chart is in
// swift_study_svg.cpp.
#include "trellis/runtime/study/swift_study.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trellis/core/error.hpp"
#include "trellis/runtime/swift/speedup.hpp"

namespace trellis::runtime {
namespace {

struct OutLine {
  std::string id;
  bool ok = false;
  std::string reason;
  std::vector<std::int32_t> tokens;
};

// The next non-blank line of an --out file, or nothing at the end.
std::optional<OutLine> next_line(std::istream& in, std::string_view what, const char* side, int& line_no) {
  std::string text;
  while (std::getline(in, text)) {
    ++line_no;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw_error(ErrorCode::kCorruptInput, "{} ({} run) line {}: not JSON ({})", what, side, line_no, e.what());
    }
    if (!j.is_object() || !j.contains("tokens") || !j["tokens"].is_array() || !j.contains("status"))
      throw_error(ErrorCode::kCorruptInput, "{} ({} run) line {}: not an output line (needs \"status\" and \"tokens\")",
                  what, side, line_no);
    OutLine o;
    if (auto it = j.find("id"); it != j.end()) o.id = it->is_string() ? it->get<std::string>() : it->dump();
    o.ok = j["status"] == "ok";
    if (auto it = j.find("reason"); it != j.end() && it->is_string()) o.reason = it->get<std::string>();
    for (const auto& t : j["tokens"]) {
      if (!t.is_number_integer())
        throw_error(ErrorCode::kCorruptInput, "{} ({} run) line {}: a token is not an integer", what, side, line_no);
      o.tokens.push_back(t.get<std::int32_t>());
    }
    return o;
  }
  return std::nullopt;
}

// Where two token lists first differ, in words; empty when they are equal.
std::string token_difference(const OutLine& a, const OutLine& b) {
  const std::size_t n = std::min(a.tokens.size(), b.tokens.size());
  for (std::size_t i = 0; i < n; ++i)
    if (a.tokens[i] != b.tokens[i])
      return fmt::format("request {}: token {} of {} differs (plain {}, SWIFT {})", a.id, i, a.tokens.size(),
                         a.tokens[i], b.tokens[i]);
  if (a.tokens.size() != b.tokens.size())
    return fmt::format("request {}: plain generated {} tokens, SWIFT {} (equal up to there)", a.id, a.tokens.size(),
                       b.tokens.size());
  return {};
}

std::string csv_num(std::optional<double> v) {
  return v && std::isfinite(*v) ? fmt::format("{:.6g}", *v) : std::string();
}

std::string csv_text(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string percent(double share) { return fmt::format("{:.1f}%", 100 * share); }

std::string identical_cell(const OutputComparison& c) {
  if (c.identical()) return "yes";
  if (c.requests == 0 && c.differing == 0) return "n/a";
  return fmt::format("NO ({}/{})", c.differing, c.requests + c.unmatched);
}

struct Shares {
  double opt = 0, draft = 0, verify = 0;
};
Shares shares(const SwiftReport& w) {
  const double t = w.opt_s + w.draft_s + w.verify_s;
  if (t <= 0) return {};
  return {w.opt_s / t, w.draft_s / t, w.verify_s / t};
}

nlohmann::json opt_json(std::optional<double> v) {
  return v && std::isfinite(*v) ? nlohmann::json(*v) : nlohmann::json();
}

}  // namespace

OutputComparison compare_outputs(std::istream& plain, std::istream& swift, std::string_view what) {
  OutputComparison c;
  int line_a = 0, line_b = 0;
  auto note = [&](std::string s) {
    ++c.differing;
    if (c.first.empty()) c.first = std::move(s);
  };
  for (;;) {
    auto a = next_line(plain, what, "plain", line_a);
    auto b = next_line(swift, what, "SWIFT", line_b);
    if (!a && !b) break;
    if (!a || !b) {
      ++c.unmatched;
      note(fmt::format("the {} run has more requests (request {} has no counterpart)", a ? "plain" : "SWIFT",
                       a ? a->id : b->id));
      continue;
    }
    if (a->id != b->id) {
      ++c.unmatched;
      note(fmt::format("line {}: request {} in the plain run, {} in the SWIFT run", line_a, a->id, b->id));
      continue;
    }
    if (!a->ok && !b->ok) {
      ++c.failed;
      continue;
    }
    if (a->ok != b->ok) {
      ++c.unmatched;
      note(fmt::format("request {}: failed in the {} run only ({})", a->id, a->ok ? "SWIFT" : "plain",
                       a->ok ? b->reason : a->reason));
      continue;
    }
    ++c.requests;
    if (auto d = token_difference(*a, *b); !d.empty()) note(std::move(d));
  }
  return c;
}

double SwiftTaskResult::speedup() const {
  return plain_tokens_per_s > 0 ? swift_tokens_per_s / plain_tokens_per_s : 0;
}

std::optional<double> SwiftTaskResult::expected_speedup() const {
  if (!swift || swift->verify_passes <= 0 || swift->sub_layers <= 0) return std::nullopt;
  const double m = swift->mean_generated_length(), alpha = swift->acceptance_rate();
  const double r = static_cast<double>(swift->skipped) / swift->sub_layers;
  if (!(m >= 1) || !(alpha > 0 && alpha <= 1) || !(r >= 0 && r < 1)) return std::nullopt;
  return swift::expected_speedup(m, alpha, r);
}

bool SwiftStudy::all_identical() const {
  for (const auto& t : tasks)
    if (!t.outputs.identical()) return false;
  return !tasks.empty();
}

std::string format_swift_table(const SwiftStudy& s) {
  std::ostringstream o;
  o << s.title << "\n\n";
  o << fmt::format("  {:<14} {:>5} {:>12} {:>12} {:>8} {:>6} {:>5} {:>8} {:>8} {:>9} {:>6} {:>7} {:>8} {:>8}  {}\n",
                   "task", "reqs", "plain tok/s", "SWIFT tok/s", "speedup", "M", "α", "E(Spd.)", "skipped",
                   "opt steps", "opt %", "draft %", "verify %", "auto-off", "identical");
  double sum_speedup = 0, sum_m = 0, sum_alpha = 0, sum_e = 0;
  int n = 0, n_swift = 0, n_e = 0;
  for (const auto& t : s.tasks) {
    const auto e = t.expected_speedup();
    std::string m = "-", alpha = "-", skipped = "-", steps = "-", opt = "-", draft = "-", verify = "-", off = "-";
    if (t.swift) {
      const auto& w = *t.swift;
      const Shares sh = shares(w);
      m = fmt::format("{:.2f}", w.mean_generated_length());
      alpha = fmt::format("{:.2f}", w.acceptance_rate());
      skipped = fmt::format("{}/{}", w.skipped, w.sub_layers);
      steps = std::to_string(w.opt_steps);
      opt = percent(sh.opt);
      draft = percent(sh.draft);
      verify = percent(sh.verify);
      off = w.turned_off ? "yes" : "no";
      sum_m += w.mean_generated_length();
      sum_alpha += w.acceptance_rate();
      ++n_swift;
    }
    if (e) sum_e += *e, ++n_e;
    sum_speedup += t.speedup();
    ++n;
    o << fmt::format("  {:<14} {:>5} {:>12.1f} {:>12.1f} {:>7.2f}x {:>6} {:>5} {:>8} {:>8} {:>9} {:>6} {:>7} {:>8} {:>8}  {}\n",
                     t.task, t.requests, t.plain_tokens_per_s, t.swift_tokens_per_s, t.speedup(), m, alpha,
                     e ? fmt::format("{:.2f}x", *e) : std::string("-"), skipped, steps, opt, draft, verify, off,
                     identical_cell(t.outputs));
  }
  if (n > 1)
    o << fmt::format("  {:<14} {:>5} {:>12} {:>12} {:>7.2f}x {:>6} {:>5} {:>8}\n", "mean", "", "", "", sum_speedup / n,
                     n_swift ? fmt::format("{:.2f}", sum_m / n_swift) : std::string("-"),
                     n_swift ? fmt::format("{:.2f}", sum_alpha / n_swift) : std::string("-"),
                     n_e ? fmt::format("{:.2f}x", sum_e / n_e) : std::string("-"));
  o << "\n";
  for (const auto& t : s.tasks) {
    if (!t.swift) {
      o << fmt::format("{}: the SWIFT run did not draft (no greedy request could, or the run was too short)\n", t.task);
    } else {
      const auto& w = *t.swift;
      o << fmt::format("{}: skip set {} ({} of {} sub-layers), matchness {:.3f}; optimisation {} after {} steps{}; "
                       "engine-measured speedup {:.2f}x over a plain token of {:.3f} ms\n",
                       t.task, w.skip_set.empty() ? "-" : w.skip_set, w.skipped, w.sub_layers, w.best_matchness,
                       w.stop_reason.empty() ? "still running" : "stopped (" + w.stop_reason + ")", w.opt_steps,
                       w.restarts > 0 ? fmt::format(", {} restarts", w.restarts) : std::string(), w.measured_speedup(),
                       1e3 * w.plain_step_s);
      if (w.turned_off) o << fmt::format("{}: auto-off fired: {}\n", t.task, w.off_reason);
    }
    for (const auto& note : t.notes) o << fmt::format("{}: {}\n", t.task, note);
  }
  o << "\nspeedup: SWIFT tokens/s over plain tokens/s, wall clock of the generation phase, same prompts; M: tokens per\n"
       "full forward (verify pass); α: accepted drafts per draft step; E(Spd.): the paper's Eq. (6) with this M, α\n"
       "and r = skipped / sub-layers; opt/draft/verify %: shares of the SWIFT iterations' time; identical: greedy\n"
       "outputs of the two runs equal request by request (SWIFT must not change them).\n";
  bool any_bad = false;
  for (const auto& t : s.tasks) {
    if (t.outputs.identical()) continue;
    if (!any_bad) o << "\n";
    any_bad = true;
    if (t.outputs.requests == 0 && t.outputs.differing == 0)
      o << fmt::format("ERROR: {}: no request finished in both runs, so nothing was compared ({} failed in both)\n",
                       t.task, t.outputs.failed);
    else
      o << fmt::format("ERROR: {}: greedy outputs DIFFER between plain and SWIFT decoding in {} of {} requests; "
                       "first: {}. SWIFT promises identical greedy outputs: this is a bug.\n",
                       t.task, t.outputs.differing, t.outputs.requests + t.outputs.unmatched, t.outputs.first);
  }
  o << fmt::format("identical: {}\n", s.all_identical() ? "yes" : "NO");
  return o.str();
}

std::string format_swift_csv(const SwiftStudy& s) {
  std::ostringstream o;
  o << "task,prompts,requests,plain_tokens,swift_tokens,plain_tokens_per_s,swift_tokens_per_s,speedup,M,alpha,"
       "expected_speedup,skipped,sub_layers,skip_set,best_matchness,opt_steps,opt_stop,restarts,opt_share,draft_share,"
       "verify_share,measured_speedup,turned_off,off_reason,identical,differing,compared\n";
  for (const auto& t : s.tasks) {
    std::vector<std::string> f = {csv_text(t.task), csv_text(t.prompts), std::to_string(t.requests),
                                  std::to_string(t.plain_tokens), std::to_string(t.swift_tokens),
                                  csv_num(t.plain_tokens_per_s), csv_num(t.swift_tokens_per_s), csv_num(t.speedup())};
    if (t.swift) {
      const auto& w = *t.swift;
      const Shares sh = shares(w);
      f.insert(f.end(), {csv_num(w.mean_generated_length()), csv_num(w.acceptance_rate()),
                         csv_num(t.expected_speedup()), std::to_string(w.skipped), std::to_string(w.sub_layers),
                         csv_text(w.skip_set), csv_num(w.best_matchness), std::to_string(w.opt_steps),
                         csv_text(w.stop_reason), std::to_string(w.restarts), csv_num(sh.opt), csv_num(sh.draft),
                         csv_num(sh.verify), csv_num(w.measured_speedup()), w.turned_off ? "1" : "0",
                         csv_text(w.off_reason)});
    } else {
      f.resize(f.size() + 16);  // the SWIFT run's fields, empty
    }
    f.insert(f.end(), {t.outputs.identical() ? "yes" : "no", std::to_string(t.outputs.differing),
                       std::to_string(t.outputs.requests)});
    o << fmt::format("{}\n", fmt::join(f, ","));
  }
  return o.str();
}

std::string format_swift_json(const SwiftStudy& s) {
  nlohmann::json j = {{"title", s.title}, {"all_identical", s.all_identical()}, {"tasks", nlohmann::json::array()}};
  for (const auto& t : s.tasks) {
    nlohmann::json x = {{"task", t.task},
                        {"prompts", t.prompts},
                        {"requests", t.requests},
                        {"plain_tokens", t.plain_tokens},
                        {"swift_tokens", t.swift_tokens},
                        {"plain_wall_s", t.plain_wall_s},
                        {"swift_wall_s", t.swift_wall_s},
                        {"plain_tokens_per_s", t.plain_tokens_per_s},
                        {"swift_tokens_per_s", t.swift_tokens_per_s},
                        {"speedup", t.speedup()},
                        {"expected_speedup", opt_json(t.expected_speedup())},
                        {"identical", t.outputs.identical()},
                        {"compared", t.outputs.requests},
                        {"differing", t.outputs.differing},
                        {"failed_in_both", t.outputs.failed},
                        {"first_difference", t.outputs.first},
                        {"notes", t.notes},
                        {"swift", nullptr}};
    if (t.swift) {
      const auto& w = *t.swift;
      const Shares sh = shares(w);
      nlohmann::json tl = nlohmann::json::array();
      for (const auto& p : w.timeline) tl.push_back({p.t_s, p.matchness, p.instance_speedup});
      x["swift"] = {{"M", w.mean_generated_length()}, {"alpha", w.acceptance_rate()},
                    {"draft_steps", w.draft_steps},     {"accepted", w.accepted},
                    {"verify_passes", w.verify_passes}, {"committed_tokens", w.committed},
                    {"skipped", w.skipped},             {"sub_layers", w.sub_layers},
                    {"skip_set", w.skip_set},           {"best_matchness", w.best_matchness},
                    {"opt_steps", w.opt_steps},         {"opt_stop", w.stop_reason},
                    {"restarts", w.restarts},           {"opt_share", sh.opt},
                    {"draft_share", sh.draft},          {"verify_share", sh.verify},
                    {"plain_step_s", w.plain_step_s},   {"measured_speedup", w.measured_speedup()},
                    {"turned_off", w.turned_off},       {"off_reason", w.off_reason},
                    {"timeline", tl}};
    }
    j["tasks"].push_back(std::move(x));
  }
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace trellis::runtime
