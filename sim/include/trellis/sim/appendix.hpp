// SiPipe's Appendix A cost model, exactly as written (../shared/papers/sipipe.txt, Table 1
// and equations 1-10). Each equation is one function so a reader can check the planner's
// starting point against the paper term by term; the refined model (cost_model.hpp) lists
// every place where it departs from these formulas and why.
//
// Units are whatever the caller keeps consistent: the paper writes the message as s*b*h and
// divides by a bandwidth B, so s*b*h must be in the unit B counts per second (bytes when B
// is bytes/s: pass h already multiplied by the element size). C is the per-layer compute
// time of the whole (unsharded) model, in seconds. Pure functions, thread-safe.
#pragma once

namespace trellis::sim::appendix {

// Table 1 symbols.
struct Symbols {
  double L = 0;      // number of transformer layers
  double C = 0;      // per-layer computation time (s)
  double N = 1;      // total number of GPUs
  double p = 1;      // pipeline-parallel degree
  double t = 1;      // tensor-parallel degree
  double alpha = 0;  // launch delay of one communication step (s)
  double s = 1;      // sequence length
  double b = 1;      // batch size
  double h = 0;      // hidden size (in the unit B counts)
  double B1 = 1;     // intra-node bandwidth (units/s)
  double B2 = 1;     // inter-node bandwidth (units/s)
  double m = 1;      // number of microbatches
  double n = 1;      // number of hosts
};

// A throughput (tokens/s) and a per-token delay (s) predicted by one equation pair.
struct Prediction {
  double throughput = 0;
  double delay = 0;
};

// Eq. 1: t_comm-TP(N) = 2L (alpha log2 N + 2sbh/B1).
double eq1_tp_comm(const Symbols& x);
// Eq. 2: T(N) = b / (LC/N + 2L alpha log2 N + 4sbhL/B1).
double eq2_tp_throughput(const Symbols& x);
// Eq. 3: D(N) = LC/N + 2L alpha log2 N + 4sbhL/B1.
double eq3_tp_delay(const Symbols& x);
// Eq. 4: t_stage = LC/N + sbh/B1.
double eq4_pp_stage(const Symbols& x);
// Eq. 5: T(N) = (b/m) / t_stage.
double eq5_pp_throughput(const Symbols& x);
// Eq. 6: D(N) = N (LC/N) + (N-1) sbh/B1.
double eq6_pp_delay(const Symbols& x);
// Eq. 7: hybrid p x t on one node: T(p,t) and D(p,t).
Prediction eq7_hybrid(const Symbols& x);
// Eq. 8: pure TP across n hosts (every all-reduce at B2).
Prediction eq8_multinode_tp(const Symbols& x);
// Eq. 9: pure PP across n hosts (n-1 transfers at B2, N-n at B1).
Prediction eq9_multinode_pp(const Symbols& x);
// Eq. 10: hybrid across n hosts.
Prediction eq10_multinode_hybrid(const Symbols& x);

// The equation pair the paper would use for a layout: eq. 2/3 (p=1, one host), 5/6 (t=1, one
// host), 7 (one host), 8, 9 or 10 (n > 1). Sets N = p t. `which` receives "eq. 7" etc.
Prediction predict(Symbols x, const char** which = nullptr);

}  // namespace trellis::sim::appendix
