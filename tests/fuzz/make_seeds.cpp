// fuzz_make_seeds OUT SHARED [EXTRA_GGUF...]: writes the seed corpora scripts/fuzz.sh starts from,
// OUT/<target>/, derived from the shared model files (nothing is committed: they are rebuilt on
// each run). Real files are too big to mutate usefully, so the seeds are shrunk copies that keep
// what the parsers look at:
//   gguf/          every file's metadata (arrays cut to 8 elements) and up to 16 tensor infos,
//                  each reshaped to one block of its format;
//   model_load/    complete 1-layer models (metadata, vocabulary and weights of layer 0 and the
//                  global tensors), also renamed to each other architecture tern knows;
//   tokenizer/     the strings of the vocabulary test vectors (*.inp), one file each;
//   chat_template/ every tokenizer.chat_template found, and a few encoded conversations;
//   prefix_entry/  valid prompt-cache entries of a few sizes and KV types;
//   http_request/  HTTP requests as clients send them (after the entry's two split-point bytes).
//   request_fields/ request bodies of both API routes and batch lines, valid and near misses.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/prefix_cache/prefix_cache_entry.h"
#include "base/error.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"

namespace fs = std::filesystem;
using namespace tern;

namespace {

constexpr uintmax_t kMaxModelSeedBytes = 256 * 1024;

GgufValue trimmed(const GgufValue& v, size_t max_elems) {
    if (v.type != GgufType::array) return v;
    GgufValue out = v;
    out.array.resize(std::min(v.array.size(), max_elems));
    for (GgufValue& e : out.array)
        e = trimmed(e, max_elems);
    return out;
}

void write_bytes(const fs::path& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
}

std::vector<fs::path> gguf_files(const fs::path& dir) {
    std::vector<fs::path> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.path().extension() == ".gguf") out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
}

void gguf_seed(const GgufFile& src, const fs::path& out) {
    GgufWriter w;
    for (const GgufKv& kv : src.metadata())
        w.set(kv.key, trimmed(kv.value, 8));
    std::vector<std::vector<uint8_t>> storage;
    storage.reserve(16);
    for (const GgufTensor& t : src.tensors()) {
        if (storage.size() == 16) break;
        const int64_t n = block_elems(t.type);
        std::vector<int64_t> ne(static_cast<size_t>(t.n_dims), 1);
        ne[0] = n;
        storage.emplace_back(row_bytes(t.type, n), uint8_t{0x3c});
        w.add_tensor(t.name, t.type, ne, storage.back());
    }
    w.write(out.string());
}

// The model cut to its first layer, with every per-layer array cut to match; "" arch keeps it.
void model_seed(const GgufFile& src, const std::string& new_arch, const fs::path& out) {
    const std::string arch = src.get_string("general.architecture");
    const int64_t n_layers = src.get_int(arch + ".block_count");
    const std::string to = new_arch.empty() ? arch : new_arch;
    GgufWriter w;
    for (const GgufKv& kv : src.metadata()) {
        std::string key = kv.key;
        GgufValue value = kv.value;
        if (key.rfind(arch + ".", 0) == 0) {
            key = to + key.substr(arch.size());
            if (value.type == GgufType::array && static_cast<int64_t>(value.array.size()) == n_layers)
                value.array.resize(1);
        }
        if (kv.key == "general.architecture") value = GgufValue::make_string(to);
        w.set(key, value);
    }
    w.set(to + ".block_count", GgufValue::make_u32(1));
    for (const GgufTensor& t : src.tensors()) {
        if (t.name.rfind("blk.", 0) == 0 && t.name.rfind("blk.0.", 0) != 0) continue;
        std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
        w.add_tensor(t.name, t.type, ne, {t.data, t.n_bytes});
    }
    w.write(out.string());
    if (fs::file_size(out) > kMaxModelSeedBytes) fs::remove(out);
}

void text_seeds(const fs::path& inp, const fs::path& out_dir) {
    std::ifstream in(inp, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string sep = "\n__ggml_vocab_test__\n";
    size_t pos = 0, k = 0;
    while (pos < text.size()) {
        size_t at = text.find(sep, pos);
        if (at == std::string::npos) at = text.size();
        write_bytes(out_dir / (inp.stem().string() + "-" + std::to_string(k++)), text.substr(pos, at - pos));
        pos = at + sep.size();
    }
}

} // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: fuzz_make_seeds OUT SHARED [EXTRA_GGUF...]\n");
        return 1;
    }
    const fs::path out = argv[1], shared = argv[2];
    for (const char* t : {"gguf", "model_load", "tokenizer", "chat_template", "prefix_entry", "http_request",
                          "request_fields"})
        fs::create_directories(out / t);

    std::vector<fs::path> files;
    for (const char* dir : {"models/gguf", "models/synth", "models/vocab"})
        for (const fs::path& f : gguf_files(shared / dir))
            files.push_back(f);
    for (int i = 3; i < argc; ++i)
        if (fs::exists(argv[i])) files.push_back(argv[i]);

    std::vector<std::string> templates;
    int n_gguf = 0, n_model = 0;
    for (const fs::path& f : files) {
        try {
            const GgufFile src = GgufFile::open(f.string());
            gguf_seed(src, out / "gguf" / f.filename());
            ++n_gguf;
            const std::string tmpl = src.get_string("tokenizer.chat_template", "");
            if (!tmpl.empty() && std::find(templates.begin(), templates.end(), tmpl) == templates.end())
                templates.push_back(tmpl);
            if (src.tensors().empty() || f.string().find("/models/vocab/") != std::string::npos) continue;
            for (const char* arch : {"", "llama", "qwen2", "qwen3", "gemma2", "gemma3"}) {
                if (src.get_string("general.architecture", "") == arch) continue;
                const std::string name = f.stem().string() + (*arch ? std::string("-as-") + arch : "") + ".gguf";
                model_seed(src, arch, out / "model_load" / name);
                n_model += fs::exists(out / "model_load" / name);
            }
        } catch (const TernError& e) {
            std::fprintf(stderr, "fuzz_make_seeds: skipping %s: %s\n", f.c_str(), e.what());
        }
    }

    for (const auto& e : fs::directory_iterator(shared / "models/vocab"))
        if (e.path().extension() == ".inp") text_seeds(e.path(), out / "tokenizer");

    for (size_t k = 0; k < templates.size(); ++k)
        write_bytes(out / "chat_template" / ("template-" + std::to_string(k)), templates[k]);
    // Conversations in the entry's layout: flags byte, then NUL-separated messages whose first
    // byte picks the role (0 system, 1 user, 2 assistant, 3 a role named by the message).
    using namespace std::string_literals; // NUL bytes inside the literals
    const std::string conversations[] = {
        "\x01\x01Hello!"s,
        "\x01\x00You are terse.\0\x01What is 2+2?\0\x02" "4\0\x01" "And 3+3?"s,
        "\x00\x01<|im_start|>user\nhi<|im_end|>\0\x02[INST] ok [/INST]"s,
        "\x01\x03tool\0\x01\xe2\x96\x81\xf0\x9f\x98\x80"s,
    };
    for (size_t k = 0; k < std::size(conversations); ++k)
        write_bytes(out / "chat_template" / ("conversation-" + std::to_string(k)), conversations[k]);

    int n_entries = 0;
    for (const uint32_t n_tokens : {1u, 3u, 16u})
        for (const KvType kv : {KvType::f16, KvType::q8_0, KvType::f8_e4m3}) {
            PrefixEntry e;
            e.identity = 0x1234567890abcdefull;
            e.chain = 0xfeedface00000000ull + n_tokens;
            e.block_index = n_tokens - 1;
            e.kv_type = kv;
            for (uint32_t k = 0; k < n_tokens; ++k)
                e.tokens.push_back(static_cast<int32_t>(k * 37 + 1));
            for (uint32_t k = 0; k < n_tokens * 24; ++k)
                e.payload.push_back(static_cast<uint8_t>(k * 13));
            const std::vector<uint8_t> bytes = serialize_prefix_entry(e);
            write_bytes(out / "prefix_entry" / ("entry-" + std::to_string(n_entries++)),
                        std::string(bytes.begin(), bytes.end()));
        }

    // Requests: two bytes choosing the entry's split point, then what a client sends.
    const std::string http_requests[] = {
        "GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\n"
        "Content-Length: 15\r\n\r\n{\"prompt\": \"a\"}",
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
        "4;ext=1\r\n{\"a\"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\nTrailer: t\r\n\r\n",
        "GET /v1/models/a%20b?x=1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET / HTTP/1.1\r\nHost: y\r\n\r\n",
    };
    for (size_t k = 0; k < std::size(http_requests); ++k)
        write_bytes(out / "http_request" / ("request-" + std::to_string(k)),
                    std::string(1, static_cast<char>(17 * k + 5)) + '\0' + http_requests[k]);

    const char* requests[] = {
        R"({"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "temperature": 0.7, "top_p": 0.9, "max_tokens": 16, "stream": true, "stream_options": {"include_usage": true},
            "stop": ["\n\n", "END"], "seed": 42, "logprobs": true, "top_logprobs": 3})",
        R"({"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "tool_calls": []}], "n": 1, "tools": [], "response_format": {"type": "text"},
            "reasoning_effort": "high", "frequency_penalty": -1.5, "presence_penalty": 2, "logit_bias": {}})",
        R"({"prompt": ["Once upon a time"], "echo": true, "logprobs": 5, "max_tokens": 1e3, "suffix": "", "best_of": 1})",
        R"({"id": "line-1", "prompt": "x", "n_predict": -1, "temp": 0, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1,
            "repeat_last_n": 64})",
        R"({"id": 7, "messages": [{"role": "user", "content": "\u00e9\ud83d\ude00<end_of_turn>"}], "max_completion_tokens": 8})",
        R"({"temperature": 1e400, "x": [[[[{"y": -1e-400}]]]], "seed": 18446744073709551615})",
    };
    for (size_t k = 0; k < std::size(requests); ++k)
        write_bytes(out / "request_fields" / ("request-" + std::to_string(k)), requests[k]);

    std::printf("fuzz_make_seeds: %d gguf, %d model_load, %zu chat templates under %s\n", n_gguf, n_model,
                templates.size(), out.c_str());
    return 0;
}
