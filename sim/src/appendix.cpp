// The formulas are transcribed literally, including the places where they disagree with the
// layouts they describe (eq. 10 charges 2L all-reduces over log2 N steps at B2 although a
// stage runs L/p layers over a t-rank group; eq. 9's throughput divides by the B2 transfer
// even on stages whose boundary stays in-host). docs/planner.md lists those departures; the
// refined model fixes them, this file must not.
#include "trellis/sim/appendix.hpp"

#include <cmath>

namespace trellis::sim::appendix {

double eq1_tp_comm(const Symbols& x) {
  return 2 * x.L * (x.alpha * std::log2(x.N) + 2 * x.s * x.b * x.h / x.B1);
}

double eq3_tp_delay(const Symbols& x) {
  return x.L * x.C / x.N + 2 * x.L * x.alpha * std::log2(x.N) + 4 * x.s * x.b * x.h * x.L / x.B1;
}

double eq2_tp_throughput(const Symbols& x) { return x.b / eq3_tp_delay(x); }

double eq4_pp_stage(const Symbols& x) { return x.L * x.C / x.N + x.s * x.b * x.h / x.B1; }

double eq5_pp_throughput(const Symbols& x) { return (x.b / x.m) / eq4_pp_stage(x); }

double eq6_pp_delay(const Symbols& x) {
  return x.N * (x.L * x.C / x.N) + (x.N - 1) * x.s * x.b * x.h / x.B1;
}

Prediction eq7_hybrid(const Symbols& x) {
  const double sbh = x.s * x.b * x.h;
  const double tp = 2 * x.L / x.p * (x.alpha * std::log2(x.t) + 2 * sbh / x.B1);
  const double comp = x.L * x.C / x.N;
  Prediction r;
  r.throughput = (x.b / x.m) / (comp + sbh / x.B1 + tp);
  r.delay = x.p * (comp + tp) + (x.p - 1) * sbh / x.B1;
  return r;
}

Prediction eq8_multinode_tp(const Symbols& x) {
  const double d = x.L * x.C / x.N + 2 * x.L * (x.alpha * std::log2(x.N) + 2 * x.s * x.b * x.h / x.B2);
  return {x.b / d, d};
}

Prediction eq9_multinode_pp(const Symbols& x) {
  const double sbh = x.s * x.b * x.h;
  Prediction r;
  r.throughput = (x.b / x.m) / (x.L * x.C / x.N + sbh / x.B2);
  r.delay = x.L * x.C + (x.n - 1) * sbh / x.B2 + (x.N - x.n) * sbh / x.B1;
  return r;
}

Prediction eq10_multinode_hybrid(const Symbols& x) {
  const double sbh = x.s * x.b * x.h;
  const double ar = 2 * x.L * (x.alpha * std::log2(x.N) + 2 * sbh / x.B2);
  Prediction r;
  r.throughput = (x.b / x.m) / (x.L * x.C / x.N + sbh / x.B2 + ar);
  r.delay = x.L * x.C + (x.n - 1) * sbh / x.B2 + (x.N - x.n) * sbh / x.B1 + ar;
  return r;
}

Prediction predict(Symbols x, const char** which) {
  x.N = x.p * x.t;
  const char* w = nullptr;
  Prediction r;
  if (x.n <= 1) {
    if (x.p == 1) {
      w = "eq. 2-3";
      r = {eq2_tp_throughput(x), eq3_tp_delay(x)};
    } else if (x.t == 1) {
      w = "eq. 5-6";
      r = {eq5_pp_throughput(x), eq6_pp_delay(x)};
    } else {
      w = "eq. 7";
      r = eq7_hybrid(x);
    }
  } else if (x.p == 1) {
    w = "eq. 8";
    r = eq8_multinode_tp(x);
  } else if (x.t == 1) {
    w = "eq. 9";
    r = eq9_multinode_pp(x);
  } else {
    w = "eq. 10";
    r = eq10_multinode_hybrid(x);
  }
  if (which) *which = w;
  return r;
}

}  // namespace trellis::sim::appendix
