// `trellis plan --validate-published [FILE]`: the published comparisons of FILE (default
// sim/data/published_results.json) through the planner's model (sim/published.hpp), as the
// Markdown table docs/planner.md shows, or JSON.
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "json_output.hpp"
#include "trellis/sim/published.hpp"

namespace trellis::launchers {

// --validate-published: published comparisons through the model (sim/published.hpp), as a
// Markdown table (docs/planner.md shows it) or JSON. Exit status 1 when a direction is wrong
// that the file does not expect to be.
int run_validate_published(const std::string& file, bool json) {
  const std::string path =
      file.empty() ? std::string(TRELLIS_SOURCE_DIR) + "/sim/data/published_results.json" : file;
  const sim::PublishedReport rep = sim::validate_published(sim::load_published(path));
  int unexpected = 0;
  for (const auto& row : rep.rows)
    if (row.evaluated && row.direction_ok != row.comparison.expect_direction_ok) ++unexpected;
  if (!json) {
    std::cout << "published results " << path << "\n\n" << sim::format_published(rep);
    if (unexpected) std::cout << unexpected << " row(s) whose direction differs from the file's expect_direction_ok\n";
    return unexpected ? 1 : 0;
  }
  nlohmann::json j = {{"file", path}, {"evaluated", rep.evaluated}, {"not_expressible", rep.unsupported},
                      {"directions_right", rep.directions_right}, {"within_30_percent", rep.within_30},
                      {"median_abs_error", rep.median_abs_error}, {"unexpected_directions", unexpected}};
  j["rows"] = nlohmann::json::array();
  for (const auto& row : rep.rows) {
    const auto& c = row.comparison;
    auto side = [&](const sim::PublishedSide& s, const sim::PublishedPrediction& p) {
      nlohmann::json x = {{"label", s.label}, {"cluster", s.cluster}, {"pp", s.p}, {"tp", s.t},
                          {"replicas", s.replicas}, {"variant", sim::to_string(s.variant)},
                          {"dtype", sim::to_string(s.precision)}, {"techniques", s.techniques_text}};
      if (s.value) x["published_value"] = *s.value;
      if (row.evaluated)
        x.update({{"predicted", p.value}, {"batch", p.batch}, {"microbatches", p.microbatches}, {"dominant", p.dominant}});
      return x;
    };
    nlohmann::json r = {{"id", c.id}, {"source", c.source}, {"url", c.url}, {"where", c.where},
                        {"engine", c.engine}, {"hardware", c.hardware}, {"model", c.model_name},
                        {"metric", sim::to_string(c.metric)}, {"prompt_len", c.prompt_len}, {"gen_len", c.gen_len},
                        {"published_ratio", sim::published_ratio_text(c)}, {"evaluated", row.evaluated},
                        {"expect_direction_ok", c.expect_direction_ok}, {"note", c.note},
                        {"a", side(c.a, row.a)}, {"b", side(c.b, row.b)}};
    if (row.evaluated)
      r.update({{"predicted_ratio", row.predicted_ratio}, {"direction_ok", row.direction_ok}, {"error", row.error},
                {"within_30_percent", row.within_30},
                {"effect_share", std::isfinite(row.effect_share) ? nlohmann::json(row.effect_share) : nlohmann::json()}});
    else
      r["not_evaluated"] = row.not_evaluated;
    j["rows"].push_back(r);
  }
  std::cout << versioned_json(j) << "\n";
  return unexpected ? 1 : 0;
}

}  // namespace trellis::launchers
