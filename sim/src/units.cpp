#include "trellis/sim/units.hpp"

namespace trellis::sim {

double bytes_per_second_from_gbit(double gbit) { return gbit_per_s(gbit); }

}  // namespace trellis::sim
