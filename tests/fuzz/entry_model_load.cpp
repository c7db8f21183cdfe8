// fuzz entry "model_load": everything `tern info` and load_model do with a model file, from bytes
// instead of a path, stopping before any forward pass: parse, the info summary, the chat template
// detection, ModelConfig, the weight views (shapes, formats, bounds) and the tokenizer.
// The steps run independently, so a file the config refuses still exercises the tokenizer.
#include <algorithm>
#include <string>
#include <vector>

#include "app/model_summary.h"
#include "engine/chat/chat_template.h"
#include "engine/model_config.h"
#include "engine/text/tokenizer.h"
#include "engine/weights.h"
#include "base/error.h"
#include "formats/gguf.h"
#include "tests/fuzz/fuzz_entries.h"

namespace tern::fuzz {
namespace {

volatile uint8_t g_sink;

// A view the loader handed out must lie inside the file: touch its first and last byte, so ASan
// reports a view past the end of the input (the fuzzer's buffer is exactly the input's size).
void touch(const WeightRef& w) {
    if (!w.present()) return;
    const size_t n = w.row_size() * static_cast<size_t>(w.n_out());
    if (n > 0) g_sink = g_sink + w.data[0] + w.data[n - 1];
}

void check_weights(const ModelWeights& w) {
    for (const WeightRef* r : {&w.token_embd, &w.output_norm, &w.output, &w.rope_freqs})
        touch(*r);
    for (const LayerWeights& l : w.layers)
        for (const WeightRef* r : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm, &l.wo,
                                   &l.bo, &l.post_attn_norm, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down, &l.b_gate,
                                   &l.b_up, &l.b_down, &l.post_ffn_norm})
            touch(*r);
}

// The file's own vocabulary (possibly mutated) encodes a fixed text and the input's last bytes
// (the end of the last tensor's data, which mutations reach without breaking the layout).
void use_tokenizer(const Tokenizer& tok, Input input) {
    const size_t tail = std::min<size_t>(input.size(), 48);
    const std::string_view texts[] = {
        "Hello world! <s> \xe2\x96\x81 42",
        {reinterpret_cast<const char*>(input.data() + input.size() - tail), tail},
    };
    for (std::string_view text : texts)
        for (bool special : {false, true}) {
            const std::vector<int32_t> ids = tok.encode(text, EncodeOptions{true, special});
            for (int32_t id : ids)
                if (id < 0 || id >= tok.vocab_size()) __builtin_trap(); // encode must give valid ids
            (void)tok.decode(ids, special);
        }
    // Every token's piece (bounded: real vocabularies reach 262,144 tokens).
    const int32_t n = std::min(tok.vocab_size(), 4096);
    for (int32_t id = -1; id <= n; ++id)
        (void)tok.token_to_piece(id, true);
    (void)tok.is_eog(tok.eos());
}

template <class F> void step(F&& f) {
    try {
        f();
    } catch (const TernError&) {
    }
}

} // namespace

void model_load(Input input) {
    try {
        const GgufFile file = GgufFile::parse(input, "fuzz-model.gguf");
        step([&] { (void)app::summarize_model(file); });
        step([&] { (void)ChatTemplate::detect(file.get_string("tokenizer.chat_template", "")); });
        step([&] {
            const ModelConfig config = model_config_from_gguf(file);
            check_weights(model_weights_from_gguf(file, config));
        });
        step([&] { use_tokenizer(*Tokenizer::from_gguf(file), input); });
    } catch (const TernError&) {
    }
}

} // namespace tern::fuzz
