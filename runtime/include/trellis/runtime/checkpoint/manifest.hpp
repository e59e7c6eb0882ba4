// Checkpoint manifests: a SHA-256 of every tensor's stored bytes, so that a damaged weight
// file is caught before it serves wrong answers.
//
// GGUF has no checksum and safetensors none either; a flipped byte inside a weight matrix
// loads silently (the loader checks names, shapes, types, offsets and alignment, and that
// norms are finite, but not the values of a matrix). `trellis verify-model` hashes every
// tensor and compares against a manifest: one shipped with the model, or the one it wrote
// the first time it saw the model (beside the file, `<model>.manifest.json`, or under
// ~/.cache/trellis/manifests when the model's directory is read-only; see
// default_manifest_path).
//
// Manifest JSON: {"format": "trellis-manifest", "version": 1, "model": file name,
// "tensors": [{"name", "dtype", "shape": [..], "bytes", "sha256"}...]} with tensors sorted by
// name (the reader's Hugging Face names).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/runtime/checkpoint/reader.hpp"

namespace trellis::runtime {

// Lower-case hex SHA-256 of `data` (OpenSSL's implementation, SHA-NI where the CPU has it).
std::string sha256_hex(std::span<const std::byte> data);

struct TensorDigest {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t bytes = 0;
  std::string sha256;
};

struct Manifest {
  std::string model;  // file or directory name, for messages
  std::vector<TensorDigest> tensors;
  std::uint64_t total_bytes() const;
};

// Hashes every tensor of `reader`. `progress(done_bytes, total_bytes)` is called after each
// tensor (may be empty). Throws kUnsupported for a reader without stored bytes.
Manifest compute_manifest(const CheckpointReader& reader,
                          const std::function<void(std::uint64_t, std::uint64_t)>& progress = {});

std::string manifest_to_json(const Manifest& m);
// Parses and validates a manifest; kCorruptInput naming `what` and the field on any
// problem (wrong format or version, missing or mistyped field, bad hex, duplicate tensor).
Manifest parse_manifest(std::string_view json, std::string_view what);

// What differs between the manifest a model should match and the one computed now.
struct ManifestDiff {
  std::vector<std::string> changed;   // same name, shape and type, different bytes
  std::vector<std::string> reshaped;  // same name, different dtype / shape / size
  std::vector<std::string> missing;   // in the manifest, not in the model
  std::vector<std::string> extra;     // in the model, not in the manifest
  bool ok() const { return changed.empty() && reshaped.empty() && missing.empty() && extra.empty(); }
  // One line per problem, at most `limit` lines, then "... and N more".
  std::string describe(std::size_t limit = 20) const;
};
ManifestDiff compare_manifests(const Manifest& expected, const Manifest& actual);

// Where verify-model looks for and writes the manifest of `model`: `<file>.manifest.json`
// beside a model file, `<dir>/trellis.manifest.json` in a model directory; when that does not
// exist and cannot be created (a read-only install), ~/.cache/trellis/manifests/<name>-<16 hex
// digits of the path's SHA-256>.manifest.json ($XDG_CACHE_HOME honoured).
std::filesystem::path default_manifest_path(const std::filesystem::path& model);

}  // namespace trellis::runtime
