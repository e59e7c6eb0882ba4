// `trellis verify-model`: SHA-256 of every tensor of a checkpoint against its manifest
// (runtime/checkpoint/manifest.hpp). GGUF and safetensors carry no checksum, so a damaged
// file otherwise loads and answers wrongly; this is the check to run after a copy, a
// download or a disk error. The first run on a model without a manifest writes one (and says
// that nothing was compared); later runs compare. Exit codes: 0 matches (or a manifest was
// written), 1 mismatch, 2 usage or unreadable input.
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "json_output.hpp"
#include "trellis/core/clock.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/progress.hpp"
#include "trellis/runtime/checkpoint/manifest.hpp"

namespace trellis::launchers {
namespace {

namespace fs = std::filesystem;

constexpr std::uintmax_t kMaxManifestBytes = 64ull << 20;

struct VerifyOptions {
  std::string model, manifest;
  bool write = false, json = false;
};

std::string read_manifest_text(const fs::path& p) {
  std::error_code ec;
  const auto size = fs::file_size(p, ec);
  if (ec) throw_error(ErrorCode::kNotFound, "manifest {}: {}", p.string(), ec.message());
  if (size > kMaxManifestBytes)
    throw_error(ErrorCode::kCorruptInput, "manifest {}: {} bytes, more than a manifest can be ({} MiB)", p.string(),
                size, kMaxManifestBytes >> 20);
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  if (!in && !in.eof()) throw_error(ErrorCode::kNotFound, "manifest {}: cannot read it", p.string());
  return s.str();
}

void write_manifest_file(const fs::path& p, const runtime::Manifest& m) {
  fs::create_directories(p.parent_path().empty() ? fs::path(".") : p.parent_path());
  // Written beside and renamed, so an interrupted write never leaves half a manifest.
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << runtime::manifest_to_json(m);
    out.flush();
    if (!out) throw_error(ErrorCode::kResourceExhausted, "manifest {}: write failed (disk full?)", tmp.string());
  }
  fs::rename(tmp, p);
}

int run_verify(Session& s, const VerifyOptions& o) {
  if (!s.is_root()) return 0;  // under mpirun, one checker is enough
  if (o.model.empty()) {
    spdlog::error("--model PATH is required (a GGUF file, a .safetensors file or a checkpoint directory)");
    return 2;
  }
  try {
    auto reader = runtime::open_checkpoint(o.model);
    const fs::path manifest = o.manifest.empty() ? runtime::default_manifest_path(o.model) : fs::path(o.manifest);
    const bool have = fs::exists(manifest);
    if (!have && !o.manifest.empty() && !o.write) {
      spdlog::error("--manifest {}: no such file (--write creates it)", manifest.string());
      return 2;
    }
    // Parse a given manifest before hashing gigabytes, so a bad one fails at once.
    runtime::Manifest expected;
    if (have && !o.write) expected = runtime::parse_manifest(read_manifest_text(manifest), manifest.string());

    const double t0 = now_seconds();
    Progress progress("verify-model", 10, !o.json);
    int shown = 0;
    auto actual = runtime::compute_manifest(*reader, [&](std::uint64_t done, std::uint64_t total) {
      const int tenth = total == 0 ? 10 : static_cast<int>(10 * done / total);
      while (shown < tenth) progress.step(fmt::format("{:.0f}% of {:.1f} MB hashed", 10.0 * ++shown, total / 1e6));
    });
    progress.done();
    const double secs = now_seconds() - t0;
    const double mb = static_cast<double>(actual.total_bytes()) / 1e6;

    if (!have || o.write) {
      write_manifest_file(manifest, actual);
      if (o.json) {
        std::cout << versioned_json({{"model", o.model}, {"manifest", manifest.string()}, {"written", true},
                                     {"tensors", actual.tensors.size()}, {"bytes", actual.total_bytes()},
                                     {"seconds", secs}}, -1) << "\n";
      } else {
        std::cout << fmt::format("wrote manifest {} ({} tensors, {:.1f} MB hashed in {:.2f} s); nothing was compared: "
                                 "later runs of verify-model check the model against it\n",
                                 manifest.string(), actual.tensors.size(), mb, secs);
      }
      return 0;
    }
    const auto diff = runtime::compare_manifests(expected, actual);
    if (o.json) {
      std::cout << versioned_json({{"model", o.model}, {"manifest", manifest.string()}, {"written", false},
                                   {"ok", diff.ok()}, {"changed", diff.changed}, {"reshaped", diff.reshaped},
                                   {"missing", diff.missing}, {"extra", diff.extra},
                                   {"tensors", actual.tensors.size()}, {"bytes", actual.total_bytes()},
                                   {"seconds", secs}}, -1) << "\n";
    } else if (diff.ok()) {
      std::cout << fmt::format("ok: all {} tensors of {} match {} ({:.1f} MB in {:.2f} s)\n", actual.tensors.size(),
                               o.model, manifest.string(), mb, secs);
    } else {
      std::cout << fmt::format("MISMATCH: {} does not match {}:\n{}", o.model, manifest.string(), diff.describe());
    }
    return diff.ok() ? 0 : 1;
  } catch (const Error& e) {
    spdlog::error("{}", e.what());
    return 2;
  }
}

}  // namespace

Action define_verify_model(CLI::App& sub) {
  auto o = std::make_shared<VerifyOptions>();
  sub.add_option("--model", o->model, "GGUF file, .safetensors file or checkpoint directory");
  sub.add_option("--manifest", o->manifest,
                 "Manifest to check against (default: <model>.manifest.json beside a file, trellis.manifest.json "
                 "in a directory, or under ~/.cache/trellis/manifests when that place is read-only)");
  sub.add_flag("--write", o->write, "Write (or overwrite) the manifest from the model as it is now");
  sub.add_flag("--json", o->json, "One JSON object on stdout");
  return [o](Session& s) { return run_verify(s, *o); };
}

}  // namespace trellis::launchers
