// Units used throughout the cost model. Everything is SI: seconds, bytes, bytes/second,
// FLOP/second. Helpers make catalog entries readable (gbps(400) is 400 Gbit/s in bytes/s).
#pragma once

namespace trellis::sim {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kGB = 1e9;
// Link rates are quoted in bits per second (Gbit/s); returns bytes per second.
constexpr double gbit_per_s(double gbit) { return gbit * 1e9 / 8.0; }
// Bandwidths quoted in GB/s (decimal); returns bytes per second.
constexpr double gbyte_per_s(double gbyte) { return gbyte * 1e9; }
constexpr double tflops(double t) { return t * 1e12; }
constexpr double us(double microseconds) { return microseconds * 1e-6; }

// Checks a unit round trip at run time (used by tests; keeps this file a real TU).
double bytes_per_second_from_gbit(double gbit);

}  // namespace trellis::sim
