// Every field is read through one helper that knows the field's path, so a malformed file
// says which field, not only that parsing failed.
#include "trellis/sim/calibration.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "catalog_lookup.hpp"
#include "trellis/core/error.hpp"

namespace trellis::sim {
namespace {

using nlohmann::json;

struct Reader {
  std::string_view origin;

  [[noreturn]] void fail(const std::string& path, std::string_view what) const {
    throw_error(ErrorCode::kCorruptInput, "calibration file {}: field '{}' {}", origin, path, what);
  }
  const json& need(const json& j, const char* key, const std::string& path) const {
    auto it = j.find(key);
    if (it == j.end()) fail(path + key, "is missing");
    return *it;
  }
  double number(const json& v, const std::string& path, bool positive) const {
    if (!v.is_number()) fail(path, "must be a number (got " + v.dump() + ")");
    double d = v.get<double>();
    if (positive ? !(d > 0) : !(d >= 0)) fail(path, positive ? "must be > 0" : "must be >= 0");
    return d;
  }
  double num(const json& j, const char* key, const std::string& prefix, bool positive = true) const {
    return number(need(j, key, prefix), prefix + key, positive);
  }
};

// Least-squares fit of time = alpha + bytes / bandwidth over the points.
CalibratedLink fit(const Reader& r, const json& points, const std::string& path) {
  if (!points.is_array() || points.size() < 2) r.fail(path, "must be an array of at least 2 points");
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0, lo = 1e300, hi = 0;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const std::string p = path + "[" + std::to_string(i) + "].";
    if (!points[i].is_object()) r.fail(path + "[" + std::to_string(i) + "]", "must be an object");
    const double x = r.num(points[i], "bytes", p), y = r.num(points[i], "seconds", p);
    n += 1, sx += x, sy += y, sxx += x * x, sxy += x * y;
    lo = std::min(lo, x), hi = std::max(hi, x);
  }
  const double den = n * sxx - sx * sx;
  if (den <= 0) r.fail(path, "needs points of at least two different sizes");
  const double slope = (n * sxy - sx * sy) / den;
  const double alpha = (sy - slope * sx) / n;
  if (!(slope > 0)) r.fail(path, "do not grow with message size (fitted bandwidth is not positive)");
  return {std::max(0.0, alpha), 1.0 / slope, lo, hi};
}

CalibratedLink read_link(const Reader& r, const json& l, const std::string& p) {
  if (l.contains("points")) return fit(r, l["points"], p + "points");
  CalibratedLink c;
  c.alpha_s = r.num(l, "alpha_us", p, false) * 1e-6;
  c.bandwidth = r.num(l, "bandwidth_GBps", p, false) * 1e9;
  c.min_bytes = l.contains("min_bytes") ? r.num(l, "min_bytes", p, false) : 0;
  c.max_bytes = l.contains("max_bytes") ? r.num(l, "max_bytes", p) : 0;
  return c;
}

// One "allreduce" entry, or nothing when it is a peer's or has no fitted bandwidth.
std::optional<std::pair<LinkKind, CalibratedAllreduce>> read_allreduce(const Reader& r, const json& a,
                                                                       const std::string& p) {
  if (!a.is_object()) r.fail(p, "must be an object");
  const json& cls = r.need(a, "class", p);
  const json& alg = r.need(a, "algorithm", p);
  if (!cls.is_string()) r.fail(p + "class", "must be a string");
  if (!alg.is_string()) r.fail(p + "algorithm", "must be a string");
  CalibratedAllreduce m;
  m.algorithm = alg.get<std::string>();
  m.ranks = static_cast<int>(r.num(a, "ranks", p));
  m.alpha_s = r.num(a, "alpha_us", p, false) * 1e-6;
  m.bus_bandwidth = r.num(a, "bus_bandwidth_GBps", p, false) * 1e9;
  if (a.contains("samples")) {
    const json& ss = a["samples"];
    if (!ss.is_array()) r.fail(p + "samples", "must be an array");
    for (std::size_t i = 0; i < ss.size(); ++i) {
      const std::string q = p + "samples[" + std::to_string(i) + "].";
      if (!ss[i].is_object()) r.fail(q.substr(0, q.size() - 1), "must be an object");
      m.samples.emplace_back(r.num(ss[i], "bytes", q), r.num(ss[i], "seconds", q));
    }
    std::sort(m.samples.begin(), m.samples.end());
  }
  LinkKind kind;
  try {
    kind = parse_link_kind(cls.get<std::string>());
  } catch (const Error& e) {
    r.fail(p + "class", e.what());
  }
  // Peers measured beside trellis are references, not what a trellis run will use.
  if (m.algorithm == "MPI_Allreduce" || m.algorithm == "gloo" || m.bus_bandwidth <= 0) return std::nullopt;
  return std::make_pair(kind, m);
}

std::vector<MatmulPoint> read_matmul(const Reader& r, const json& a) {
  if (!a.is_array()) r.fail("compute.matmul", "must be an array");
  std::vector<MatmulPoint> out;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string p = "compute.matmul[" + std::to_string(i) + "].";
    if (!a[i].is_object()) r.fail(p.substr(0, p.size() - 1), "must be an object");
    MatmulPoint m;
    m.threads = static_cast<int>(r.num(a[i], "threads", p));
    m.rows = r.num(a[i], "rows", p);
    m.params_per_s = r.num(a[i], "params_per_s", p);
    if (a[i].contains("tp")) m.tp = static_cast<int>(r.num(a[i], "tp", p));
    if (a[i].contains("context")) m.context = r.num(a[i], "context", p, false);
    if (a[i].contains("concurrent")) m.concurrent = static_cast<int>(r.num(a[i], "concurrent", p));
    if (a[i].contains("coupled")) {
      if (!a[i]["coupled"].is_boolean()) r.fail(p + "coupled", "must be true or false");
      m.coupled = a[i]["coupled"].get<bool>();
    }
    if (a[i].contains("pp")) m.pp = static_cast<int>(r.num(a[i], "pp", p));
    // A coupled measurement ran whole TP groups, at most one per stage computing at once.
    if (m.coupled && (m.concurrent % m.tp != 0 || m.concurrent > m.tp * m.pp || m.tp * m.pp < 2))
      r.fail(p + "concurrent", fmt::format("must be a multiple of tp ({}) up to tp x pp ({}) on a coupled point of at "
                                           "least 2 ranks (got {})", m.tp, m.tp * m.pp, m.concurrent));
    out.push_back(m);
  }
  return out;
}

}  // namespace

LinkKind parse_link_kind(std::string_view name) {
  const std::string k = detail::catalog_key(name);
  if (k == "same-process" || k == "self") return LinkKind::kSameProcess;
  if (k == "shm" || k == "shared-memory" || k == "sm") return LinkKind::kSharedMemory;
  if (k == "nvlink" || k == "nvl") return LinkKind::kNvlink;
  if (k == "pcie" || k == "pci") return LinkKind::kPcie;
  if (k == "rdma" || k == "ib" || k == "roce") return LinkKind::kRdma;
  if (k == "tcp") return LinkKind::kTcp;
  throw_error(ErrorCode::kInvalidArgument,
              "unknown link class '{}'; valid: same-process, shm, nvlink, pcie, rdma, tcp", name);
}

Calibration Calibration::parse(std::string_view text, std::string_view origin) {
  Reader r{origin};
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw_error(ErrorCode::kCorruptInput, "calibration file {}: not valid JSON: {}", origin, e.what());
  }
  if (!j.is_object()) r.fail("(top level)", "must be a JSON object");
  Calibration c;
  c.origin_ = std::string(origin);
  const json& schema = r.need(j, "schema", "");
  if (!schema.is_string() || schema.get<std::string>() != "trellis.calibration.v1")
    r.fail("schema", "must be \"trellis.calibration.v1\" (got " + schema.dump() + ")");
  if (j.contains("machine") && j["machine"].is_string()) c.machine_ = j["machine"].get<std::string>();
  if (j.contains("links")) {
    const json& links = j["links"];
    if (!links.is_array()) r.fail("links", "must be an array");
    for (std::size_t i = 0; i < links.size(); ++i) {
      const std::string p = "links[" + std::to_string(i) + "].";
      const json& cls = r.need(links[i], "class", p);
      if (!cls.is_string()) r.fail(p + "class", "must be a string");
      LinkKind kind;
      try {
        kind = parse_link_kind(cls.get<std::string>());
      } catch (const Error& e) {
        r.fail(p + "class", e.what());
      }
      c.links_[kind] = read_link(r, links[i], p);
    }
  }
  if (j.contains("allreduce")) {
    const json& ar = j["allreduce"];
    if (!ar.is_array()) r.fail("allreduce", "must be an array");
    for (std::size_t i = 0; i < ar.size(); ++i) {
      auto m = read_allreduce(r, ar[i], "allreduce[" + std::to_string(i) + "].");
      if (!m) continue;
      const auto key = std::make_pair(m->first, m->second.ranks);
      c.allreduce_all_[key].push_back(m->second);
      auto it = c.allreduce_.find(key);
      if (it == c.allreduce_.end() || m->second.seconds(1 << 20) < it->second.seconds(1 << 20))
        c.allreduce_[key] = m->second;
    }
  }
  if (j.contains("compute")) {
    const json& cj = j["compute"];
    if (!cj.is_object()) r.fail("compute", "must be an object");
    CalibratedCompute cc;
    cc.device = cj.value("device", std::string("cpu"));
    cc.flops = r.num(cj, "flops", "compute.");
    cc.memory_bandwidth = r.num(cj, "memory_bandwidth", "compute.");
    if (cj.contains("cores")) cc.cores = static_cast<int>(r.num(cj, "cores", "compute."));
    if (cj.contains("threads_per_rank")) cc.threads_per_rank = static_cast<int>(r.num(cj, "threads_per_rank", "compute."));
    if (cj.contains("matmul")) cc.matmul = read_matmul(r, cj["matmul"]);
    c.compute_ = cc;
  }
  if (j.contains("runtime")) {
    const json& rj = j["runtime"];
    if (!rj.is_object()) r.fail("runtime", "must be an object");
    CalibratedRuntime rt;
    rt.step_overhead_s = r.num(rj, "step_overhead_us", "runtime.", false) * 1e-6;
    if (rj.contains("step_overhead_per_seq_us"))
      rt.step_overhead_per_seq_s = r.num(rj, "step_overhead_per_seq_us", "runtime.", false) * 1e-6;
    c.runtime_ = rt;
  }
  if (c.links_.empty() && !c.compute_ && c.allreduce_.empty() && !c.runtime_)
    r.fail("links", "and 'allreduce' and 'compute' are all absent: nothing to calibrate");
  return c;
}

Calibration Calibration::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_error(ErrorCode::kNotFound, "cannot open calibration file {}", path);
  std::stringstream s;
  s << in.rdbuf();
  return parse(s.str(), path);
}

const CalibratedAllreduce* Calibration::allreduce(LinkKind kind, int ranks) const {
  auto it = allreduce_.find({kind, ranks});
  return it == allreduce_.end() ? nullptr : &it->second;
}

std::vector<std::pair<double, double>> Calibration::allreduce_curve(LinkKind kind, int ranks) const {
  auto it = allreduce_all_.find({kind, ranks});
  if (it == allreduce_all_.end()) return {};
  std::map<double, double> best;  // bytes -> fastest seconds
  for (const auto& a : it->second)
    for (const auto& [bytes, sec] : a.samples) {
      auto [pos, fresh] = best.emplace(bytes, sec);
      if (!fresh) pos->second = std::min(pos->second, sec);
    }
  std::vector<std::pair<double, double>> out(best.begin(), best.end());
  // A smaller message is never slower than a larger one (it could be padded): a point
  // measured slower than the next larger one is noise, not the cost of fewer bytes.
  for (std::size_t i = out.size(); i-- > 1;) out[i - 1].second = std::min(out[i - 1].second, out[i].second);
  return out;
}

const CalibratedLink* Calibration::link(LinkKind kind) const {
  auto it = links_.find(kind);
  return it == links_.end() ? nullptr : &it->second;
}

}  // namespace trellis::sim
