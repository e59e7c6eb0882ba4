// The GGUF checkpoint reader: a CheckpointReader over one .gguf file that answers in
// Hugging Face names and layouts (see reader.hpp), so the model loads SmolLM2's GGUF the way
// it loads safetensors, each tensor-parallel rank reading only its rows or columns.
//
// What it translates:
//  * names: token_embd -> model.embed_tokens, blk.N.attn_q -> model.layers.N.self_attn.q_proj,
//    ffn_gate/up/down -> mlp.gate/up/down_proj, attn_norm -> input_layernorm,
//    ffn_norm -> post_attention_layernorm, output_norm -> model.norm, output -> lm_head.
//    Tensors with other names keep their GGUF name.
//  * shapes: GGUF lists ne[0] (the contiguous dimension) first; the reader reports the
//    reversed, row-major shape ([out, in] for linears), which needs no data movement.
//  * rotary layout: llama.cpp's converter reorders the rows of Q and K inside each head
//    from Hugging Face's half-split rotary layout (rows i and i + d/2 form a pair) to the
//    interleaved one (rows 2i and 2i + 1). For architecture "llama" the reader undoes it
//    row by row, so HF row h*d + s*d/2 + i is read from stored row h*d + 2i + s.
//  * types: F32, F16, BF16, Q8_0, Q4_0, Q4_1 are dequantised at load into f32 or bf16.
//    Only the blocks covering the requested columns of the requested rows are touched
//    (a quantised row is sliced at block boundaries, then trimmed). read_slice_raw hands
//    out the stored blocks of block-aligned slices unchanged (rotary rows still reordered).
//  * config: config_json() synthesises a Hugging Face config.json from the <arch>.* keys.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "trellis/runtime/checkpoint/gguf.hpp"
#include "trellis/runtime/checkpoint/reader.hpp"

namespace trellis::runtime {

// Opens `path` (a .gguf file). Throws kNotFound / kIo / kCorruptInput naming the file.
std::unique_ptr<CheckpointReader> open_gguf(const std::filesystem::path& path);

namespace gguf {

// Hugging Face name for a GGUF tensor name, or nullopt when it has no Llama meaning.
std::optional<std::string> hf_name_from_gguf(std::string_view gguf_name);
// GGUF name for a Hugging Face Llama tensor name, or nullopt.
std::optional<std::string> gguf_name_from_hf(std::string_view hf_name);

// For a Q or K weight with `n_heads` heads of `rows / n_heads` rows each: the stored GGUF
// row that holds Hugging Face row `hf_row`. Its inverse is gguf_row_to_hf.
std::int64_t hf_row_to_gguf(std::int64_t hf_row, std::int64_t rows, std::int64_t n_heads);
std::int64_t gguf_row_to_hf(std::int64_t gguf_row, std::int64_t rows, std::int64_t n_heads);

// A Hugging Face config.json (text) built from the metadata of `file`: hidden_size,
// intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
// head_dim, rms_norm_eps, rope_theta, max_position_embeddings, vocab_size,
// tie_word_embeddings, bos/eos_token_id and rope_scaling when present.
// Throws kNotFound naming the file and the first missing key.
std::string config_json_from_metadata(const GgufFile& file);

}  // namespace gguf
}  // namespace trellis::runtime
