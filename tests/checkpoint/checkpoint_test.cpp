// safetensors reading, writing and slicing, and the corrupt-input cases: each must throw
// trellis::Error whose message names the file and the tensor at fault.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <span>

#include "trellis/core/error.hpp"
#include "trellis/runtime/checkpoint/manifest.hpp"
#include "trellis/runtime/checkpoint/reader.hpp"
#include "trellis/runtime/checkpoint/safetensors.hpp"

namespace fs = std::filesystem;
using namespace trellis;
using namespace trellis::runtime;

namespace {

fs::path temp_dir(const std::string& tag) {
  auto d = fs::temp_directory_path() / fmt::format("trellis_ckpt_{}_{}", tag, ::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// value of element i of tensor k, exactly representable in bf16 and f16
float val(std::size_t k, std::size_t i) { return static_cast<float>(static_cast<int>((i * 7 + k * 13) % 61) - 30) / 8.0f; }

std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>(u >> 16);  // values above are exact in bf16
}
std::uint16_t to_f16(float f) {  // exact for the small dyadic values used here
  if (f == 0) return 0;
  std::uint16_t s = f < 0 ? 0x8000 : 0;
  int e;
  float m = std::frexp(std::fabs(f), &e);  // f = m * 2^e, m in [0.5, 1)
  int man = static_cast<int>(std::ldexp(m, 11)) - 1024;
  return static_cast<std::uint16_t>(s | ((e - 1 + 15) << 10) | man);
}

void fill(const std::vector<TensorSpec>& specs, std::size_t k, std::span<std::byte> out) {
  std::size_t n = 1;
  for (auto d : specs[k].shape) n *= static_cast<std::size_t>(d);
  for (std::size_t i = 0; i < n; ++i) {
    float v = val(k, i);
    if (specs[k].dtype == "F32") std::memcpy(out.data() + 4 * i, &v, 4);
    else {
      std::uint16_t h = specs[k].dtype == "BF16" ? to_bf16(v) : to_f16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
}

std::vector<TensorSpec> sample_specs() {
  return {{"a.weight", "F32", {6, 10}}, {"b.weight", "BF16", {8, 4}}, {"c.weight", "F16", {5, 3}},
          {"d.bias", "F32", {7}}};
}

// Expects `f` to throw trellis::Error whose message contains every string in `needles`.
template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> needles, ErrorCode code) {
  try {
    f();
    FAIL() << "no error thrown";
  } catch (const Error& e) {
    std::string m = e.what();
    for (const auto& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "message '" << m << "' lacks '" << n << "'";
    EXPECT_EQ(e.code(), code) << m;
  }
}

// Writes a raw safetensors file from a header object and a data section.
void write_raw(const fs::path& p, const nlohmann::json& header, std::size_t data_bytes, std::size_t keep = SIZE_MAX) {
  std::string h = header.dump();
  std::string bytes(8, '\0');
  std::uint64_t n = h.size();
  for (int b = 0; b < 8; ++b) bytes[b] = static_cast<char>((n >> (8 * b)) & 0xff);
  bytes += h;
  bytes.append(data_bytes, '\x01');
  if (keep < bytes.size()) bytes.resize(keep);
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST(Safetensors, RoundTripAndSlices) {
  auto dir = temp_dir("rt");
  auto specs = sample_specs();
  write_safetensors(dir / "model.safetensors", specs, [&](std::size_t k, std::span<std::byte> o) { fill(specs, k, o); });
  auto r = open_checkpoint(dir);
  ASSERT_EQ(r->tensors().size(), 4u);
  for (std::size_t k = 0; k < specs.size(); ++k) {
    const TensorInfo& t = r->require(specs[k].name);
    EXPECT_EQ(t.dtype, specs[k].dtype);
    EXPECT_EQ(t.shape, specs[k].shape);
    // A column slice and a row slice, in both output types.
    Slice s{t.rows() > 1 ? 1 : 0, t.rows(), 1, t.cols() - 1};
    std::vector<float> f(static_cast<std::size_t>(s.rows() * s.cols()));
    std::vector<std::uint16_t> b(f.size());
    r->read_slice(t.name, s, ElemType::kF32, f.data());
    r->read_slice(t.name, s, ElemType::kBF16, b.data());
    for (std::int64_t i = 0; i < s.rows(); ++i)
      for (std::int64_t j = 0; j < s.cols(); ++j) {
        auto src = static_cast<std::size_t>((s.row_begin + i) * t.cols() + s.col_begin + j);
        auto dst = static_cast<std::size_t>(i * s.cols() + j);
        EXPECT_EQ(f[dst], val(k, src)) << t.name;
        EXPECT_EQ(b[dst], to_bf16(val(k, src))) << t.name;
      }
  }
  EXPECT_FALSE(r->config_json().has_value());
  std::ofstream(dir / "config.json") << "{\"hidden_size\": 4}";
  EXPECT_EQ(open_checkpoint(dir / "model.safetensors")->config_json().value(), "{\"hidden_size\": 4}");
  fs::remove_all(dir);
}

TEST(Safetensors, ShardedWithIndex) {
  auto dir = temp_dir("shard");
  auto specs = sample_specs();
  auto files = write_safetensors_sharded(dir, specs, [&](std::size_t k, std::span<std::byte> o) { fill(specs, k, o); }, 100);
  EXPECT_GE(files.size(), 3u);
  EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  auto r = open_checkpoint(dir);
  ASSERT_EQ(r->tensors().size(), 4u);
  std::vector<float> row(10);
  r->read_slice("a.weight", {5, 6, 0, 10}, ElemType::kF32, row.data());
  for (int j = 0; j < 10; ++j) EXPECT_EQ(row[j], val(0, 50 + j));
  EXPECT_NE(r->require("c.weight").file, r->require("a.weight").file);
  fs::remove_all(dir);
}

TEST(SafetensorsCorrupt, TruncatedFile) {
  auto dir = temp_dir("trunc");
  auto specs = sample_specs();
  auto p = dir / "model.safetensors";
  write_safetensors(p, specs, [&](std::size_t k, std::span<std::byte> o) { fill(specs, k, o); });
  fs::resize_file(p, fs::file_size(p) - 10);  // cuts into the last tensor by offset
  // The tensor whose range now runs past the end is the last written: d.bias.
  expect_error([&] { open_checkpoint(dir); }, {p.string(), "d.bias", "truncated"}, ErrorCode::kCorruptInput);
  fs::resize_file(p, 20);  // into the header itself
  expect_error([&] { open_checkpoint(dir); }, {p.string(), "header length"}, ErrorCode::kCorruptInput);
  fs::remove_all(dir);
}

TEST(SafetensorsCorrupt, OffsetsOutsideFile) {
  auto dir = temp_dir("oob");
  auto p = dir / "model.safetensors";
  nlohmann::json h = {{"w", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {1000000, 1000016}}}}};
  write_raw(p, h, 16);
  expect_error([&] { open_checkpoint(p); }, {p.string(), "'w'", "past the end"}, ErrorCode::kCorruptInput);
  h = {{"w", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 18446744073709551615ull}}}}};
  write_raw(p, h, 16);
  expect_error([&] { open_checkpoint(p); }, {p.string(), "'w'"}, ErrorCode::kCorruptInput);
  fs::remove_all(dir);
}

TEST(SafetensorsCorrupt, OverlappingTensors) {
  auto dir = temp_dir("overlap");
  auto p = dir / "model.safetensors";
  nlohmann::json h = {{"first", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}}},
                      {"second", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {8, 24}}}}};
  write_raw(p, h, 24);
  expect_error([&] { open_checkpoint(p); }, {p.string(), "'second'", "overlap", "first"}, ErrorCode::kCorruptInput);
  fs::remove_all(dir);
}

TEST(SafetensorsCorrupt, ShapeDtypeDisagreeWithBytes) {
  auto dir = temp_dir("shape");
  auto p = dir / "model.safetensors";
  nlohmann::json h = {{"w", {{"dtype", "BF16"}, {"shape", {4, 4}}, {"data_offsets", {0, 16}}}}};
  write_raw(p, h, 16);
  expect_error([&] { open_checkpoint(p); }, {p.string(), "'w'", "needs 32"}, ErrorCode::kCorruptInput);
  h = {{"w", {{"dtype", "Q9"}, {"shape", {4}}, {"data_offsets", {0, 4}}}}};
  write_raw(p, h, 16);
  expect_error([&] { open_checkpoint(p); }, {p.string(), "'w'", "unknown dtype"}, ErrorCode::kCorruptInput);
  h = {{"w", {{"dtype", "F32"}, {"shape", {-4}}, {"data_offsets", {0, 16}}}}};
  write_raw(p, h, 16);
  expect_error([&] { open_checkpoint(p); }, {p.string(), "'w'"}, ErrorCode::kCorruptInput);
  fs::remove_all(dir);
}

TEST(SafetensorsCorrupt, BadJsonAndHeaderLength) {
  auto dir = temp_dir("json");
  auto p = dir / "model.safetensors";
  std::string bytes = std::string("\x05\0\0\0\0\0\0\0", 8) + "{\"a\":";
  std::ofstream(p, std::ios::binary) << bytes;
  expect_error([&] { open_checkpoint(p); }, {p.string(), "JSON"}, ErrorCode::kCorruptInput);
  bytes = std::string("\xff\xff\xff\xff\0\0\0\0", 8) + "{}";
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
  expect_error([&] { open_checkpoint(p); }, {p.string(), "header length"}, ErrorCode::kCorruptInput);
  fs::remove_all(dir);
}

TEST(SafetensorsCorrupt, IndexNamesMissingTensorOrShard) {
  auto dir = temp_dir("index");
  auto specs = sample_specs();
  write_safetensors_sharded(dir, specs, [&](std::size_t k, std::span<std::byte> o) { fill(specs, k, o); }, 100);
  auto index = nlohmann::json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  std::string shard = index["weight_map"]["a.weight"];
  index["weight_map"]["ghost.weight"] = shard;
  std::ofstream(dir / "model.safetensors.index.json", std::ios::trunc) << index.dump();
  expect_error([&] { open_checkpoint(dir); }, {(dir / shard).string(), "ghost.weight"}, ErrorCode::kNotFound);
  index["weight_map"].erase("ghost.weight");
  index["weight_map"]["lost.weight"] = "model-00009-of-00009.safetensors";
  std::ofstream(dir / "model.safetensors.index.json", std::ios::trunc) << index.dump();
  expect_error([&] { open_checkpoint(dir); }, {"model-00009-of-00009.safetensors", "lost.weight"}, ErrorCode::kNotFound);
  fs::remove_all(dir);
}

TEST(SafetensorsCorrupt, MissingTensorAndBadSlice) {
  auto dir = temp_dir("missing");
  auto specs = sample_specs();
  write_safetensors(dir / "model.safetensors", specs, [&](std::size_t k, std::span<std::byte> o) { fill(specs, k, o); });
  auto r = open_checkpoint(dir);
  expect_error([&] { r->require("model.norm.weight"); }, {dir.string(), "model.norm.weight"}, ErrorCode::kNotFound);
  std::vector<float> buf(100);
  expect_error([&] { r->read_slice("nope", {0, 1, 0, 1}, ElemType::kF32, buf.data()); }, {dir.string(), "nope"},
               ErrorCode::kNotFound);
  expect_error([&] { r->read_slice("a.weight", {0, 7, 0, 10}, ElemType::kF32, buf.data()); },
               {(dir / "model.safetensors").string(), "a.weight", "outside"}, ErrorCode::kInvalidArgument);
  fs::remove_all(dir);
}

TEST(SafetensorsCorrupt, RandomBytesNeverCrash) {
  // A cheap in-test fuzz: random mutations of a valid file either parse or throw Error.
  auto specs = sample_specs();
  auto dir = temp_dir("mut");
  auto p = dir / "model.safetensors";
  write_safetensors(p, specs, [&](std::size_t k, std::span<std::byte> o) { fill(specs, k, o); });
  std::ifstream in(p, std::ios::binary);
  std::vector<char> good((std::istreambuf_iterator<char>(in)), {});
  std::mt19937 rng(1234);
  for (int it = 0; it < 2000; ++it) {
    auto bytes = good;
    int n = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < n; ++m) bytes[rng() % std::min<std::size_t>(bytes.size(), 400)] = static_cast<char>(rng());
    if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
    try {
      parse_safetensors({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}, "mut");
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("mut"), std::string::npos);
    }
  }
  fs::remove_all(dir);
}

TEST(Manifest, Sha256KnownAnswers) {
  // FIPS 180-2 examples.
  EXPECT_EQ(sha256_hex({}), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string abc = "abc";
  EXPECT_EQ(sha256_hex(std::as_bytes(std::span(abc.data(), abc.size()))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Manifest, EveryFlippedByteIsFoundAndNamed) {
  auto dir = temp_dir("manifest");
  auto specs = sample_specs();
  const auto file = dir / "model.safetensors";
  write_safetensors(file, specs, [&](std::size_t k, std::span<std::byte> o) { fill(specs, k, o); });
  const auto clean = compute_manifest(*open_checkpoint(dir));
  ASSERT_EQ(clean.tensors.size(), 4u);
  EXPECT_EQ(clean.total_bytes(), 6u * 10 * 4 + 8 * 4 * 2 + 5 * 3 * 2 + 7 * 4);
  // Round trip through JSON.
  const auto back = parse_manifest(manifest_to_json(clean), "test");
  EXPECT_TRUE(compare_manifests(clean, back).ok());
  // Flip one bit of every data byte in turn (the header is checked by the parser): each
  // flip is reported as exactly the tensor that holds the byte.
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::uint64_t header = 0;
  for (int b = 0; b < 8; ++b) header |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[static_cast<std::size_t>(b)])) << (8 * b);
  const std::size_t data = 8 + header;
  int checked = 0;
  for (std::size_t at = data; at < bytes.size(); at += 7) {
    std::string bad = bytes;
    bad[at] = static_cast<char>(bad[at] ^ 0x04);
    std::ofstream(file, std::ios::binary | std::ios::trunc).write(bad.data(), static_cast<std::streamsize>(bad.size()));
    auto diff = compare_manifests(clean, compute_manifest(*open_checkpoint(dir)));
    ASSERT_EQ(diff.changed.size(), 1u) << "byte " << at;
    EXPECT_TRUE(diff.missing.empty() && diff.extra.empty() && diff.reshaped.empty());
    // Which tensor holds byte `at`: the file's own header says (data_offsets).
    const auto head = nlohmann::json::parse(bytes.substr(8, header));
    std::string holder;
    for (const auto& [name, e] : head.items()) {
      if (name == "__metadata__") continue;
      const auto begin = data + e["data_offsets"][0].get<std::size_t>(), end = data + e["data_offsets"][1].get<std::size_t>();
      if (at >= begin && at < end) holder = name;
    }
    EXPECT_EQ(diff.changed[0], holder) << "byte " << at;
    ++checked;
  }
  EXPECT_GT(checked, 20);
  fs::remove_all(dir);
}

TEST(Manifest, MissingExtraReshapedAndBadManifests) {
  Manifest a;
  a.model = "m";
  a.tensors = {{"x", "F32", {2, 2}, 16, std::string(64, 'a')}, {"y", "F32", {4}, 16, std::string(64, 'b')},
               {"z", "F32", {1}, 4, std::string(64, 'c')}};
  Manifest b = a;
  b.tensors.erase(b.tensors.begin());                       // x missing
  b.tensors[0].shape = {2, 2};                               // y reshaped
  b.tensors.push_back({"w", "F32", {1}, 4, std::string(64, 'd')});  // w extra
  auto d = compare_manifests(a, b);
  EXPECT_EQ(d.missing, std::vector<std::string>{"x"});
  EXPECT_EQ(d.reshaped, std::vector<std::string>{"y"});
  EXPECT_EQ(d.extra, std::vector<std::string>{"w"});
  EXPECT_TRUE(d.changed.empty());
  EXPECT_NE(d.describe().find("'x': in the manifest, not in the model"), std::string::npos) << d.describe();
  EXPECT_NE(d.describe(1).find("... and 2 more"), std::string::npos) << d.describe(1);

  const auto good = nlohmann::json::parse(manifest_to_json(a));
  auto broken = [&](auto edit) {
    auto j = good;
    edit(j);
    return j.dump();
  };
  expect_error([&] { parse_manifest("not json", "m.json"); }, {"m.json", "not JSON"}, ErrorCode::kCorruptInput);
  expect_error([&] { parse_manifest(broken([](auto& j) { j["format"] = "other"; }), "m.json"); }, {"format"},
               ErrorCode::kCorruptInput);
  expect_error([&] { parse_manifest(broken([](auto& j) { j["version"] = 9; }), "m.json"); }, {"version 9"},
               ErrorCode::kCorruptInput);
  expect_error([&] { parse_manifest(broken([](auto& j) { j["tensors"][1].erase("sha256"); }), "m.json"); },
               {"tensor entry 1", "sha256"}, ErrorCode::kCorruptInput);
  expect_error([&] { parse_manifest(broken([](auto& j) { j["tensors"][0]["sha256"] = "XYZ"; }), "m.json"); },
               {"tensor entry 0", "64 lower-case hex"}, ErrorCode::kCorruptInput);
  expect_error([&] { parse_manifest(broken([](auto& j) { j["tensors"][2]["bytes"] = "four"; }), "m.json"); },
               {"tensor entry 2", "\"bytes\"", "wrong type"}, ErrorCode::kCorruptInput);
  expect_error([&] { parse_manifest(broken([](auto& j) { j["tensors"][2]["name"] = "x"; }), "m.json"); },
               {"'x' is listed twice"}, ErrorCode::kCorruptInput);
  std::string deep = "{\"tensors\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  expect_error([&] { parse_manifest(deep, "m.json"); }, {"nested deeper"}, ErrorCode::kCorruptInput);
}

TEST(Manifest, DefaultPathBesideTheModelOrInTheCache) {
  auto dir = temp_dir("mpath");
  EXPECT_EQ(default_manifest_path(dir / "model.gguf"), dir / "model.gguf.manifest.json");
  EXPECT_EQ(default_manifest_path(dir), dir / "trellis.manifest.json");
  if (::geteuid() != 0) {  // root may write anywhere: the read-only case needs a normal user
    fs::permissions(dir, fs::perms::owner_write, fs::perm_options::remove);
    auto p = default_manifest_path(dir / "model.gguf");
    EXPECT_NE(p.string().find("trellis/manifests/model.gguf-"), std::string::npos) << p;
    fs::permissions(dir, fs::perms::owner_write, fs::perm_options::add);
  }
  fs::remove_all(dir);
}
