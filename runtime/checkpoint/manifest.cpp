// Checkpoint manifests: per-tensor SHA-256, JSON form, comparison, default location.
#include "trellis/runtime/checkpoint/manifest.hpp"

#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>

#include "trellis/core/error.hpp"

namespace trellis::runtime {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::string_view kFormat = "trellis-manifest";
constexpr int kVersion = 1;

bool is_hex_digest(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

template <typename T>
T field(const json& o, const char* key, std::string_view what, std::string_view where) {
  auto it = o.find(key);
  if (it == o.end()) throw_error(ErrorCode::kCorruptInput, "{}: {} has no \"{}\"", what, where, key);
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw_error(ErrorCode::kCorruptInput, "{}: {} field \"{}\" has the wrong type ({})", what, where, key,
                it->type_name());
  }
}

bool directory_writable(const fs::path& dir) { return ::access(dir.c_str(), W_OK) == 0; }

// Deepest nesting of arrays/objects outside strings. A manifest is 3 levels deep; checking
// before parsing keeps a hostile file ([[[[...]]]] 100k deep) from reaching the parser.
int nesting_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

std::string sha256_hex(std::span<const std::byte> data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(data.data(), data.size(), md, &n, EVP_sha256(), nullptr) != 1 || n != 32)
    throw_error(ErrorCode::kInternal, "SHA-256 of {} bytes failed in OpenSSL", data.size());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(64, '0');
  for (unsigned int i = 0; i < n; ++i) {
    out[2 * i] = kHex[md[i] >> 4];
    out[2 * i + 1] = kHex[md[i] & 15];
  }
  return out;
}

std::uint64_t Manifest::total_bytes() const {
  std::uint64_t n = 0;
  for (const auto& t : tensors) n += t.bytes;
  return n;
}

Manifest compute_manifest(const CheckpointReader& reader,
                          const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  Manifest m;
  m.model = reader.describe();
  std::uint64_t total = 0, done = 0;
  for (const auto& t : reader.tensors()) total += reader.stored_bytes(t.name).size();
  for (const auto& t : reader.tensors()) {
    const auto bytes = reader.stored_bytes(t.name);
    m.tensors.push_back({t.name, t.dtype, t.shape, bytes.size(), sha256_hex(bytes)});
    done += bytes.size();
    if (progress) progress(done, total);
  }
  return m;
}

std::string manifest_to_json(const Manifest& m) {
  json tensors = json::array();
  for (const auto& t : m.tensors)
    tensors.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"bytes", t.bytes}, {"sha256", t.sha256}});
  json j{{"format", kFormat}, {"version", kVersion}, {"model", m.model}, {"tensors", tensors}};
  return j.dump(1) + "\n";
}

Manifest parse_manifest(std::string_view text, std::string_view what) {
  if (nesting_depth(text) > 4)
    throw_error(ErrorCode::kCorruptInput, "{}: nested deeper than a manifest is (4 levels)", what);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw_error(ErrorCode::kCorruptInput, "{}: not JSON ({})", what, e.what());
  }
  if (!j.is_object()) throw_error(ErrorCode::kCorruptInput, "{}: a manifest is a JSON object", what);
  if (field<std::string>(j, "format", what, "the manifest") != kFormat)
    throw_error(ErrorCode::kCorruptInput, "{}: \"format\" is not \"{}\"", what, kFormat);
  if (auto v = field<int>(j, "version", what, "the manifest"); v != kVersion)
    throw_error(ErrorCode::kCorruptInput, "{}: manifest version {} (this trellis reads {})", what, v, kVersion);
  Manifest m;
  m.model = field<std::string>(j, "model", what, "the manifest");
  const auto it = j.find("tensors");
  if (it == j.end() || !it->is_array()) throw_error(ErrorCode::kCorruptInput, "{}: \"tensors\" is not an array", what);
  std::map<std::string, bool> seen;
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    const std::string where = fmt::format("tensor entry {}", i);
    if (!e.is_object()) throw_error(ErrorCode::kCorruptInput, "{}: {} is not an object", what, where);
    TensorDigest d;
    d.name = field<std::string>(e, "name", what, where);
    d.dtype = field<std::string>(e, "dtype", what, where);
    d.shape = field<std::vector<std::int64_t>>(e, "shape", what, where);
    d.bytes = field<std::uint64_t>(e, "bytes", what, where);
    d.sha256 = field<std::string>(e, "sha256", what, where);
    if (!is_hex_digest(d.sha256))
      throw_error(ErrorCode::kCorruptInput, "{}: {} ('{}'): sha256 is not 64 lower-case hex digits", what, where, d.name);
    if (!seen.emplace(d.name, true).second)
      throw_error(ErrorCode::kCorruptInput, "{}: tensor '{}' is listed twice", what, d.name);
    m.tensors.push_back(std::move(d));
  }
  return m;
}

ManifestDiff compare_manifests(const Manifest& expected, const Manifest& actual) {
  ManifestDiff d;
  std::map<std::string, const TensorDigest*> now;
  for (const auto& t : actual.tensors) now[t.name] = &t;
  for (const auto& e : expected.tensors) {
    auto it = now.find(e.name);
    if (it == now.end()) {
      d.missing.push_back(e.name);
      continue;
    }
    const TensorDigest& a = *it->second;
    if (a.dtype != e.dtype || a.shape != e.shape || a.bytes != e.bytes) d.reshaped.push_back(e.name);
    else if (a.sha256 != e.sha256) d.changed.push_back(e.name);
    now.erase(it);
  }
  for (const auto& [name, t] : now) d.extra.push_back(name);
  return d;
}

std::string ManifestDiff::describe(std::size_t limit) const {
  std::vector<std::string> lines;
  for (const auto& n : changed) lines.push_back(fmt::format("tensor '{}': bytes differ (SHA-256 mismatch)", n));
  for (const auto& n : reshaped) lines.push_back(fmt::format("tensor '{}': type, shape or size differs", n));
  for (const auto& n : missing) lines.push_back(fmt::format("tensor '{}': in the manifest, not in the model", n));
  for (const auto& n : extra) lines.push_back(fmt::format("tensor '{}': in the model, not in the manifest", n));
  std::string out;
  for (std::size_t i = 0; i < lines.size() && i < limit; ++i) out += lines[i] + "\n";
  if (lines.size() > limit) out += fmt::format("... and {} more\n", lines.size() - limit);
  return out;
}

fs::path default_manifest_path(const fs::path& model) {
  std::error_code ec;
  const bool dir = fs::is_directory(model, ec);
  const fs::path beside = dir ? model / "trellis.manifest.json" : fs::path(model.string() + ".manifest.json");
  const fs::path parent = dir ? model : (model.has_parent_path() ? model.parent_path() : fs::path("."));
  if (fs::exists(beside, ec) || directory_writable(parent)) return beside;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path cache = xdg && *xdg ? fs::path(xdg) : fs::path(home && *home ? home : "/tmp") / ".cache";
  const std::string canon = fs::weakly_canonical(model, ec).string();
  const std::string key = sha256_hex(std::as_bytes(std::span(canon.data(), canon.size()))).substr(0, 16);
  const fs::path base = model.filename().empty() ? model.parent_path().filename() : model.filename();
  const std::string name = base.string();
  return cache / "trellis" / "manifests" / fmt::format("{}-{}.manifest.json", name, key);
}

}  // namespace trellis::runtime
