// The tokenizer a GGUF file describes in its metadata (tokenizer.ggml.*), written as the
// tokenizer.json and tokenizer_config.json that make our Tokenizer encode as llama.cpp does:
//   * "gpt2" (byte-level BPE): tokens, merges, and tokenizer.ggml.pre naming the pre-tokenizer
//     regex (gpt-2, llama-bpe/llama3/llama-v3, smaug-bpe, qwen2, gpt-4o/llama4; others are an error);
//     llama-bpe looks whole words up before merging, as llama.cpp does.
//   * "llama" (SentencePiece BPE): tokens and scores; the merge order is the score order of the
//     merged piece (llama.cpp merges the adjacent pair whose merged piece scores highest), bytes
//     unknown to the vocabulary fall back to <0xXX> tokens, spaces become U+2581 and a space is
//     prepended to each stretch of text (tokenizer.ggml.add_space_prefix, default true).
// Control and unknown tokens become special added tokens, user-defined ones plain added tokens; as in
// llama.cpp, end-of-turn/end-of-text markers ("</s>", "<|im_end|>", "<|eot_id|>", ...) are control
// tokens whatever type the file gives them.
// BOS/EOS are added per tokenizer.ggml.add_bos_token / add_eos_token (llama.cpp's defaults when
// absent: BOS for "llama" and llama-bpe vocabularies). tokenizer.chat_template (and the named
// tokenizer.chat_template.NAME) become the chat templates.
#pragma once

#include <string>

#include "base/json.h"

namespace astrai::tokenizer {

// `meta` is a GGUF file's metadata (base/gguf_file.h); `where` names the file for errors.
Json gguf_tokenizer_json(const Json& meta, const std::string& where);
Json gguf_tokenizer_config(const Json& meta, const std::string& where);

}  // namespace astrai::tokenizer
