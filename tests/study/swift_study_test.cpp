// The SWIFT study's comparison and formats on hand-made values: outputs compared request by
// request (identical, a differing token, a missing request, failures), the Table 4 columns
// and Eq. (6), a loud "NO" when outputs differ, the CSV's fixed columns, the JSON, and the
// Figure 6 SVG (panels, series, thinning, the differing task marked).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "trellis/core/error.hpp"
#include "trellis/runtime/study/swift_study.hpp"
#include "trellis/runtime/swift/speedup.hpp"

namespace trellis::runtime {
namespace {

OutputComparison compare(const std::string& a, const std::string& b) {
  std::istringstream x(a), y(b);
  return compare_outputs(x, y, "test");
}

const char* kTwo = R"({"id":"r1","status":"ok","reason":"","tokens":[1,2,3]}
{"id":"r2","status":"ok","reason":"","tokens":[4,5]}
)";

TEST(SwiftStudyCompare, IdenticalOutputs) {
  const auto c = compare(kTwo, kTwo);
  EXPECT_TRUE(c.identical());
  EXPECT_EQ(c.requests, 2);
  EXPECT_EQ(c.differing, 0);
  EXPECT_TRUE(c.first.empty());
}

TEST(SwiftStudyCompare, ADifferingTokenIsNamed) {
  const auto c = compare(kTwo, R"({"id":"r1","status":"ok","reason":"","tokens":[1,2,3]}
{"id":"r2","status":"ok","reason":"","tokens":[4,9]}
)");
  EXPECT_FALSE(c.identical());
  EXPECT_EQ(c.requests, 2);
  EXPECT_EQ(c.differing, 1);
  EXPECT_EQ(c.unmatched, 0);  // compared: the table says NO (1/2), not 1/3
  EXPECT_EQ(c.first, "request r2: token 1 of 2 differs (plain 5, SWIFT 9)");
}

TEST(SwiftStudyCompare, LengthMissingAndFailures) {
  auto c = compare(kTwo, R"({"id":"r1","status":"ok","reason":"","tokens":[1,2,3,7]}
)");
  EXPECT_EQ(c.differing, 2);  // r1 longer, r2 missing
  EXPECT_EQ(c.requests, 1);
  EXPECT_EQ(c.unmatched, 1);
  EXPECT_NE(c.first.find("plain generated 3 tokens, SWIFT 4"), std::string::npos) << c.first;
  c = compare(R"({"id":"a","status":"failed","reason":"bad","tokens":[]})", R"({"id":"a","status":"failed","reason":"bad","tokens":[]})");
  EXPECT_FALSE(c.identical());  // nothing compared
  EXPECT_EQ(c.failed, 1);
  c = compare(R"({"id":"a","status":"ok","reason":"","tokens":[1]})", R"({"id":"a","status":"failed","reason":"kv","tokens":[]})");
  EXPECT_EQ(c.differing, 1);
  EXPECT_NE(c.first.find("failed in the SWIFT run only (kv)"), std::string::npos) << c.first;
  c = compare(R"({"id":"a","status":"ok","reason":"","tokens":[1]})", R"({"id":"b","status":"ok","reason":"","tokens":[1]})");
  EXPECT_EQ(c.differing, 1);
}

TEST(SwiftStudyCompare, MalformedLineNamesTheFile) {
  try {
    (void)compare("not json\n", kTwo);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptInput);
    EXPECT_NE(std::string(e.what()).find("test (plain run) line 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)compare(kTwo, R"({"id":"r1","tokens":[1]})"), Error);  // no status
}

SwiftReport report(double m, double alpha, int skipped, int sub_layers) {
  SwiftReport w;
  w.verify_passes = 100;
  w.committed = static_cast<std::int64_t>(m * 100);
  w.draft_steps = 200;
  w.accepted = static_cast<std::int64_t>(alpha * 200);
  w.opt_steps = 40;
  w.opt_s = 0.1;
  w.draft_s = 0.6;
  w.verify_s = 0.3;
  w.plain_step_s = 0.01;
  w.skip_set = "attn 1,2 mlp 3";
  w.skipped = skipped;
  w.sub_layers = sub_layers;
  w.best_matchness = 0.97;
  w.stop_reason = "target matchness reached";
  for (int i = 0; i < 40; ++i) w.timeline.push_back({0.001 * i, 0.5 + 0.01 * i, 0});
  for (int i = 0; i < 1000; ++i) w.timeline.push_back({0.04 + 0.001 * i, 0.9, 1.0 + 0.0003 * i});
  return w;
}

SwiftTaskResult task(const char* name, bool identical) {
  SwiftTaskResult t;
  t.task = name;
  t.prompts = std::string("examples/swift/") + name + ".jsonl";
  t.requests = 20;
  t.plain_tokens = 1280;
  t.swift_tokens = 1280;
  t.plain_wall_s = 10;
  t.swift_wall_s = 8;
  t.plain_tokens_per_s = 128;
  t.swift_tokens_per_s = 160;
  t.swift = report(3.0, 0.9, 12, 60);
  t.outputs.requests = 20;  // compared, the differing one included
  t.outputs.differing = identical ? 0 : 1;
  if (!identical) t.outputs.first = "request r7: token 3 of 64 differs (plain 5, SWIFT 9)";
  return t;
}

SwiftStudy study(bool second_identical) {
  SwiftStudy s;
  s.title = "trellis study swift: test";
  s.tasks = {task("summarisation", true), task("reasoning", second_identical)};
  return s;
}

TEST(SwiftStudyFormat, TableHasTable4ColumnsAndSaysIdentical) {
  const auto s = study(true);
  EXPECT_TRUE(s.all_identical());
  EXPECT_NEAR(s.tasks[0].speedup(), 1.25, 1e-12);
  ASSERT_TRUE(s.tasks[0].expected_speedup());
  EXPECT_NEAR(*s.tasks[0].expected_speedup(), swift::expected_speedup(3.0, 0.9, 0.2), 1e-12);
  const std::string t = format_swift_table(s);
  for (const char* col : {"task", "plain tok/s", "SWIFT tok/s", "speedup", " M ", "α", "E(Spd.)", "skipped",
                          "opt steps", "opt %", "draft %", "verify %", "auto-off", "identical"})
    EXPECT_NE(t.find(col), std::string::npos) << col << "\n" << t;
  EXPECT_NE(t.find("  summarisation     20        128.0        160.0    1.25x   3.00  0.90"), std::string::npos) << t;
  EXPECT_NE(t.find("12/60"), std::string::npos);
  EXPECT_NE(t.find("10.0%"), std::string::npos);  // optimisation share: 0.1 of 1.0 s
  EXPECT_NE(t.find("mean"), std::string::npos);
  EXPECT_NE(t.find("skip set attn 1,2 mlp 3"), std::string::npos);
  EXPECT_NE(t.find("identical: yes"), std::string::npos);
  EXPECT_EQ(t.find("ERROR"), std::string::npos);
}

TEST(SwiftStudyFormat, DifferingOutputsAreLoud) {
  const auto s = study(false);
  EXPECT_FALSE(s.all_identical());
  const std::string t = format_swift_table(s);
  EXPECT_NE(t.find("NO (1/20)"), std::string::npos) << t;
  EXPECT_NE(t.find("ERROR: reasoning: greedy outputs DIFFER"), std::string::npos) << t;
  EXPECT_NE(t.find("request r7: token 3 of 64 differs"), std::string::npos);
  EXPECT_NE(t.find("identical: NO"), std::string::npos);
  const std::string csv = format_swift_csv(s);
  EXPECT_NE(csv.find(",no,1,20\n"), std::string::npos) << csv;
  const auto j = nlohmann::json::parse(format_swift_json(s));
  EXPECT_FALSE(j["all_identical"].get<bool>());
  EXPECT_FALSE(j["tasks"][1]["identical"].get<bool>());
  EXPECT_EQ(j["tasks"][1]["first_difference"], "request r7: token 3 of 64 differs (plain 5, SWIFT 9)");
  EXPECT_NE(format_swift_svg(s).find("OUTPUTS DIFFER from plain decoding (1 of 20)"), std::string::npos);
}

TEST(SwiftStudyFormat, CsvColumnsAreFixed) {
  auto s = study(true);
  s.tasks[1].swift.reset();  // a run that did not draft: empty SWIFT fields, same width
  const std::string csv = format_swift_csv(s);
  std::istringstream in(csv);
  std::string header, row1, row2;
  std::getline(in, header);
  std::getline(in, row1);
  std::getline(in, row2);
  EXPECT_EQ(header,
            "task,prompts,requests,plain_tokens,swift_tokens,plain_tokens_per_s,swift_tokens_per_s,speedup,M,alpha,"
            "expected_speedup,skipped,sub_layers,skip_set,best_matchness,opt_steps,opt_stop,restarts,opt_share,"
            "draft_share,verify_share,measured_speedup,turned_off,off_reason,identical,differing,compared");
  auto fields = [](const std::string& line) {  // commas outside quotes
    int n = 1;
    bool quoted = false;
    for (char c : line) {
      if (c == '"') quoted = !quoted;
      else if (c == ',' && !quoted) ++n;
    }
    return n;
  };
  EXPECT_EQ(fields(row1), 27) << row1;
  EXPECT_EQ(fields(row2), 27) << row2;
  EXPECT_NE(row1.find("\"summarisation\",\"examples/swift/summarisation.jsonl\",20,1280,1280,128,160,1.25,3,0.9,"),
            std::string::npos)
      << row1;
  EXPECT_NE(row2.find(",1.25,,,,,,"), std::string::npos) << row2;
  EXPECT_FALSE(s.tasks[1].expected_speedup());
  EXPECT_NE(format_swift_table(s).find("reasoning: the SWIFT run did not draft"), std::string::npos);
}

TEST(SwiftStudyFormat, JsonCarriesEverything) {
  const auto j = nlohmann::json::parse(format_swift_json(study(true)));
  EXPECT_TRUE(j["all_identical"].get<bool>());
  ASSERT_EQ(j["tasks"].size(), 2u);
  const auto& t = j["tasks"][0];
  EXPECT_EQ(t["task"], "summarisation");
  EXPECT_NEAR(t["speedup"].get<double>(), 1.25, 1e-12);
  EXPECT_NEAR(t["swift"]["M"].get<double>(), 3.0, 1e-12);
  EXPECT_NEAR(t["swift"]["alpha"].get<double>(), 0.9, 1e-12);
  EXPECT_NEAR(t["swift"]["opt_share"].get<double>(), 0.1, 1e-12);
  EXPECT_EQ(t["swift"]["timeline"].size(), 1040u);
  EXPECT_EQ(t["swift"]["skip_set"], "attn 1,2 mlp 3");
}

TEST(SwiftStudyFormat, SvgHasAPanelPerTaskWithBothSeries) {
  const std::string svg = format_swift_svg(study(true), 100);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  auto count = [&](const std::string& what) {
    std::size_t n = 0;
    for (auto p = svg.find(what); p != std::string::npos; p = svg.find(what, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("<polyline"), 4u);  // matchness and speedup, two tasks
  EXPECT_EQ(count("<title>optimisation: 40 steps"), 2u);
  EXPECT_NE(svg.find("summarisation: wall-clock speedup 1.25x"), std::string::npos);
  EXPECT_NE(svg.find("wall clock 1.25x"), std::string::npos);
  EXPECT_EQ(svg.find("OUTPUTS DIFFER"), std::string::npos);
  // Thinned: at most 100 points per series (1000 verify points in the report).
  for (auto q = svg.find("<polyline"); q != std::string::npos; q = svg.find("<polyline", q + 1)) {
    const auto a = svg.find("points=\"", q) + 8, b = svg.find('"', a);
    std::size_t pts = 0;
    for (auto i = a; i < b; ++i) pts += svg[i] == ' ';
    EXPECT_LE(pts, 101u);
  }
  // Optimisation steps interleaved with verify passes are one phase; a re-entry after a long
  // acceleration phase is another.
  auto phased = study(true);
  phased.tasks.resize(1);
  auto& tl = phased.tasks[0].swift->timeline;
  tl.clear();
  double t = 0;
  for (int i = 0; i < 10; ++i) tl.push_back({t += 0.01, 0.5, 0}), tl.push_back({t += 0.01, 0.5, 1.1});
  for (int i = 0; i < 50; ++i) tl.push_back({t += 0.01, 0.6, 1.2});
  for (int i = 0; i < 3; ++i) tl.push_back({t += 0.01, 0.6, 0}), tl.push_back({t += 0.01, 0.7, 1.3});
  const std::string ph = format_swift_svg(phased);
  EXPECT_NE(ph.find("<title>optimisation: 10 steps"), std::string::npos) << ph;
  EXPECT_NE(ph.find("<title>optimisation: 3 steps"), std::string::npos);
  // A long title wraps instead of running off the chart.
  phased.title = std::string(100, 'x') + "; " + std::string(50, 'y');
  EXPECT_NE(format_swift_svg(phased).find(">" + std::string(50, 'y') + "</text>"), std::string::npos);
  // A study with no timeline (a run that never drafted) still draws its panel.
  auto s = study(true);
  s.tasks[0].swift.reset();
  EXPECT_NE(format_swift_svg(s).find("no SWIFT iterations"), std::string::npos);
}

}  // namespace
}  // namespace trellis::runtime
