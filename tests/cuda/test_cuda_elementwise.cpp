// kernels/cuda/elementwise.h against the CPU twins (kernels/cpu/ops.h and CpuBackend::argmax's rule), on
// random rows of ragged widths (not multiples of 4, 32 or the block size), aligned (float4 loads) and
// misaligned by one float (single-float loads).
//
// Tolerances, which must hold on a GPU as well as in the emulator (whose tanhf / libm are the CPU's):
//   rmsnorm_rows, add_residual with a norm: 4 ulp per element and a normalised error of 1e-6. Every float
//     step is the CPU's IEEE operation; only the double sum of squares is added in another order, which can
//     move the float mean by one ulp in rare rows, and so the output by about 2 ulp.
//   swiglu, add_residual without a norm: bit for bit (tern's exp_f32 and IEEE division on both sides).
//   geglu_tanh, softcap: normalised error 2e-6. The device's tanhf is within 2 ulp (~2.4e-7 absolute, as
//     |tanh| <= 1); scaled by |0.5 x up| (at most about max |out| for these inputs) plus the roundings of
//     two products that is under 6e-7 of the largest output. Moving every tanh of these inputs by 2 ulp
//     on the CPU gives 2e-7 (geglu) and 1.6e-7 (softcap); the emulator, with the CPU's tanhf, gives 0.
//   swiglu_oai: normalised error 2e-6, the device's expf (a few ulp from the CPU's std::exp) in the sigmoid.
//   argmax_rows, argmax_rows_split: the same index, exactly.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <random>
#include <vector>

#include "base/finite.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul_q8.h"
#include "tests/cuda_device_array.h"
#include "tests/kernel_test_data.h"

using tern::test::DeviceArray;
using tern::test::normalised_error;
using tern::test::ulp_distance;

namespace {

constexpr int64_t kWidths[] = {1, 31, 33, 640, 2048 + 7, 4096, 16384};
constexpr float kEps = 1e-6f;

// Rows of N(0, 1) scaled per row by 10^k, k in [-3, 3]: the norm must not care about a row's magnitude.
std::vector<float> scaled_rows(int64_t rows, int64_t width, uint32_t seed) {
    std::vector<float> v = tern::test::random_normal(static_cast<size_t>(rows * width), seed);
    std::mt19937 rng(seed + 1);
    for (int64_t r = 0; r < rows; ++r) {
        const float scale = std::pow(10.0f, static_cast<float>(static_cast<int>(rng() % 7) - 3));
        for (int64_t i = 0; i < width; ++i) v[static_cast<size_t>(r * width + i)] *= scale;
    }
    return v;
}

// The CPU forward's rows: rmsnorm_f32 row by row (backend_cpu.cpp rmsnorm_rows).
std::vector<float> cpu_rmsnorm_rows(const std::vector<float>& x, const float* w, int64_t rows, int64_t width) {
    std::vector<float> y(x.size());
    for (int64_t r = 0; r < rows; ++r) tern::rmsnorm_f32(x.data() + r * width, w, y.data() + r * width, width, kEps);
    return y;
}

void check_close_ulps(const std::vector<float>& got, const std::vector<float>& want) {
    REQUIRE(got.size() == want.size());
    int64_t worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, ulp_distance(got[i], want[i]));
    CHECK(worst <= 4);
    CHECK(normalised_error(got, want) <= 1e-6);
}

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
    std::vector<uint32_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = __builtin_bit_cast(uint32_t, v[i]);
    return b;
}

// The CPU backend's rule (engine/cpu/backend_cpu.cpp CpuBackend::argmax): the first strictly larger value.
int32_t cpu_argmax(const float* row, int64_t width) {
    int32_t best = 0;
    for (int32_t t = 1; t < static_cast<int32_t>(width); ++t)
        if (row[t] > row[best]) best = t;
    return best;
}

} // namespace

TEST_CASE("rmsnorm_rows matches rmsnorm_f32 per row: weighted or not, in place or not, aligned or not") {
    for (int64_t width : kWidths) {
        for (int64_t rows : {1, 3, 17}) {
            for (int offset : {0, 1}) { // offset 1: rows start off 16-byte alignment, single-float loads
                CAPTURE(width);
                CAPTURE(rows);
                CAPTURE(offset);
                const size_t count = static_cast<size_t>(rows * width);
                const std::vector<float> x = scaled_rows(rows, width, static_cast<uint32_t>(width + rows));
                std::vector<float> w = tern::test::random_normal(static_cast<size_t>(width), 7, 0.5f);
                for (float& v : w) v += 1.0f;
                DeviceArray<float> dx(count + 1), dy(count + 1), dw(static_cast<size_t>(width) + 1);
                std::vector<float> padded(count + 1, 0.0f);
                std::copy(x.begin(), x.end(), padded.begin() + offset);
                dx.write(padded);
                std::vector<float> wpad(static_cast<size_t>(width) + 1, 0.0f);
                std::copy(w.begin(), w.end(), wpad.begin() + offset);
                dw.write(wpad);
                auto slice = [&](const std::vector<float>& v) {
                    return std::vector<float>(v.begin() + offset, v.begin() + offset + static_cast<ptrdiff_t>(count));
                };

                tern::cuda::rmsnorm_rows(dx.get() + offset, dw.get() + offset, dy.get() + offset, rows, width, kEps,
                                         nullptr);
                check_close_ulps(slice(dy.read()), cpu_rmsnorm_rows(x, w.data(), rows, width));
                CHECK(slice(dx.read()) == x); // the input is left alone

                tern::cuda::rmsnorm_rows(dx.get() + offset, nullptr, dy.get() + offset, rows, width, kEps, nullptr);
                check_close_ulps(slice(dy.read()), cpu_rmsnorm_rows(x, nullptr, rows, width));

                tern::cuda::rmsnorm_rows(dx.get() + offset, dw.get() + offset, dx.get() + offset, rows, width, kEps,
                                         nullptr);
                check_close_ulps(slice(dx.read()), cpu_rmsnorm_rows(x, w.data(), rows, width));
            }
        }
    }
}

TEST_CASE("rmsnorm_rows_q8 writes rmsnorm_rows' floats and quantize_activations' bytes of them, in one launch") {
    for (int64_t width : {32, 96, 640, 4096, 14336}) {
        for (int64_t rows : {1, 3, 17}) {
            for (bool weighted : {true, false}) {
                CAPTURE(width);
                CAPTURE(rows);
                CAPTURE(weighted);
                const size_t count = static_cast<size_t>(rows * width);
                std::vector<float> x = scaled_rows(rows, width, static_cast<uint32_t>(width * 3 + rows));
                std::fill(x.begin(), x.begin() + 32, 0.0f);   // an all-zero block: d = 0
                std::vector<float> w = tern::test::random_normal(static_cast<size_t>(width), 9, 0.5f);
                for (float& v : w) v += 1.0f;
                const DeviceArray<float> dx(x), dw(w);
                DeviceArray<float> dy(count), dy_ref(count);
                const size_t q8_bytes = tern::cuda::quantized_activation_bytes(rows, width);
                DeviceArray<uint8_t> dq(q8_bytes), dq_ref(q8_bytes);
                dq.write(std::vector<uint8_t>(q8_bytes, 0xA5));   // poisoned: every byte must be written
                const float* wp = weighted ? dw.get() : nullptr;
                REQUIRE(tern::cuda::rmsnorm_rows_q8_takes(dx.get(), wp, dy.get(), dq.get(), width));
                tern::cuda::rmsnorm_rows_q8(dx.get(), wp, dy.get(), rows, width, kEps, dq.get(), nullptr);
                tern::cuda::rmsnorm_rows(dx.get(), wp, dy_ref.get(), rows, width, kEps, nullptr);
                tern::cuda::quantize_activations(dy_ref.get(), rows, width, dq_ref.get(), nullptr);
                CHECK(dy.read() == dy_ref.read());
                CHECK(dq.read() == dq_ref.read());
            }
        }
    }
    // What it does not take: a width of partial blocks, a misaligned pointer.
    DeviceArray<float> a(64 + 4);
    DeviceArray<uint8_t> q(tern::cuda::quantized_activation_bytes(1, 64) + 16);
    CHECK_FALSE(tern::cuda::rmsnorm_rows_q8_takes(a.get(), nullptr, a.get(), q.get(), 48));
    CHECK_FALSE(tern::cuda::rmsnorm_rows_q8_takes(a.get() + 1, nullptr, a.get(), q.get(), 32));
    CHECK_FALSE(tern::cuda::rmsnorm_rows_q8_takes(a.get(), nullptr, a.get(), q.get() + 4, 32));
    CHECK_THROWS_AS(tern::cuda::rmsnorm_rows_q8(a.get(), nullptr, a.get(), 1, 48, kEps, q.get(), nullptr),
                    std::invalid_argument);
}

TEST_CASE("add_residual adds y, or RMSNorm(y) * w, to x (the forward's post-norm and residual)") {
    for (int64_t width : kWidths) {
        for (int offset : {0, 1}) {
            CAPTURE(width);
            CAPTURE(offset);
            const int64_t rows = 3;
            const size_t count = static_cast<size_t>(rows * width);
            const std::vector<float> x = tern::test::random_normal(count, 11, 4.0f);
            const std::vector<float> y = scaled_rows(rows, width, 12);
            std::vector<float> w = tern::test::random_normal(static_cast<size_t>(width), 13, 0.5f);
            DeviceArray<float> dx(count + 1), dy(count + 1), dw(static_cast<size_t>(width) + 1);
            auto put = [&](DeviceArray<float>& d, const std::vector<float>& v) {
                std::vector<float> padded(d.size(), 0.0f);
                std::copy(v.begin(), v.end(), padded.begin() + offset);
                d.write(padded);
            };
            auto get = [&](const DeviceArray<float>& d) {
                const std::vector<float> v = d.read();
                return std::vector<float>(v.begin() + offset, v.begin() + offset + static_cast<ptrdiff_t>(d.size() - 1));
            };
            put(dx, x);
            put(dy, y);
            put(dw, w);

            // Without a norm: x + y, the same bits as the CPU's loop.
            tern::cuda::add_residual(dx.get() + offset, dy.get() + offset, nullptr, rows, width, kEps, nullptr);
            std::vector<float> want = x;
            for (size_t i = 0; i < count; ++i) want[i] += y[i];
            CHECK(bits_of(get(dx)) == bits_of(want));

            // With gemma's post-norm: out = rmsnorm(y) * w, then x += out.
            put(dx, x);
            tern::cuda::add_residual(dx.get() + offset, dy.get() + offset, dw.get() + offset, rows, width, kEps,
                                     nullptr);
            const std::vector<float> normed = cpu_rmsnorm_rows(y, w.data(), rows, width);
            want = x;
            for (size_t i = 0; i < count; ++i) want[i] += normed[i];
            CHECK(normalised_error(get(dx), want) <= 1e-6);
            CHECK(get(dy) == y);
        }
    }
}

TEST_CASE("swiglu gives swiglu_f32's bits (tern's exp_f32 on the device), in place and not") {
    for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{33}, int64_t{640}, int64_t{2048 + 7}, int64_t{65536 + 3}}) {
        for (int offset : {0, 1}) {
            CAPTURE(n);
            CAPTURE(offset);
            const size_t count = static_cast<size_t>(n);
            std::vector<float> gate = tern::test::random_normal(count, 21, 4.0f);
            const std::vector<float> up = tern::test::random_normal(count, 22, 2.0f);
            // The exp clamps (-87, 88 after the sign flip), its rounding edges, zeros and denormals.
            const float edges[] = {100.0f, -100.0f, 87.0f, -88.0f, 87.5f, -88.5f, 0.0f, -0.0f, 1e-39f, -1e-39f,
                                   20.0f, -20.0f, 0.34657359f, -0.34657359f};
            for (size_t i = 0; i < std::size(edges) && i < count; ++i) gate[(i * 7919) % count] = edges[i];
            std::vector<float> want(count);
            tern::swiglu_f32(gate.data(), up.data(), want.data(), n);

            DeviceArray<float> dg(count + 1), du(count + 1), dout(count + 1);
            std::vector<float> padded(count + 1, 0.0f);
            std::copy(gate.begin(), gate.end(), padded.begin() + offset);
            dg.write(padded);
            std::copy(up.begin(), up.end(), padded.begin() + offset);
            du.write(padded);
            auto get = [&](const DeviceArray<float>& d) {
                const std::vector<float> v = d.read();
                return std::vector<float>(v.begin() + offset, v.begin() + offset + static_cast<ptrdiff_t>(count));
            };
            tern::cuda::swiglu(dg.get() + offset, du.get() + offset, dout.get() + offset, n, nullptr);
            CHECK(bits_of(get(dout)) == bits_of(want));
            tern::cuda::swiglu(dg.get() + offset, du.get() + offset, dg.get() + offset, n, nullptr); // out == gate
            CHECK(bits_of(get(dg)) == bits_of(want));
        }
    }
}

TEST_CASE("geglu_tanh and softcap match geglu_tanh_f32 and softcap_f32 within 2e-6 (the device's tanhf)") {
    for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{33}, int64_t{640}, int64_t{2048 + 7}, int64_t{65536 + 3}}) {
        for (int offset : {0, 1}) {
            CAPTURE(n);
            CAPTURE(offset);
            const size_t count = static_cast<size_t>(n);
            const std::vector<float> gate = tern::test::random_normal(count, 31, 3.0f);
            const std::vector<float> up = tern::test::random_normal(count, 32);
            DeviceArray<float> dg(count + 1), du(count + 1);
            auto put = [&](DeviceArray<float>& d, const std::vector<float>& v) {
                std::vector<float> padded(count + 1, 0.0f);
                std::copy(v.begin(), v.end(), padded.begin() + offset);
                d.write(padded);
            };
            auto get = [&](const DeviceArray<float>& d) {
                const std::vector<float> v = d.read();
                return std::vector<float>(v.begin() + offset, v.begin() + offset + static_cast<ptrdiff_t>(count));
            };

            std::vector<float> want(count);
            tern::geglu_tanh_f32(gate.data(), up.data(), want.data(), n);
            put(dg, gate);
            put(du, up);
            tern::cuda::geglu_tanh(dg.get() + offset, du.get() + offset, dg.get() + offset, n, nullptr);
            CHECK(normalised_error(get(dg), want) <= 2e-6);

            // Logits and scores of N(0, 60^2) against gemma2's caps: the saturated and the linear part.
            for (float cap : {30.0f, 50.0f}) {
                CAPTURE(cap);
                std::vector<float> x = tern::test::random_normal(count, 33, 60.0f);
                put(dg, x);
                tern::cuda::softcap(dg.get() + offset, n, cap, nullptr);
                tern::softcap_f32(x.data(), n, cap);
                CHECK(normalised_error(get(dg), x) <= 2e-6);
            }
        }
    }
}

TEST_CASE("scale multiplies every element by s, bit for bit the host's product, at any length and alignment") {
    for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{33}, int64_t{2048 + 7}}) {
        for (int offset : {0, 1}) {
            for (float s : {0.22f, 0.125f, -3.0f}) {
                CAPTURE(n);
                CAPTURE(offset);
                CAPTURE(s);
                const size_t count = static_cast<size_t>(n);
                const std::vector<float> x = tern::test::random_normal(count, 34, 5.0f);
                std::vector<float> padded(count + 1, 0.0f);
                std::copy(x.begin(), x.end(), padded.begin() + offset);
                DeviceArray<float> d(count + 1);
                d.write(padded);
                tern::cuda::scale(d.get() + offset, n, s, nullptr);
                const std::vector<float> got = d.read();
                std::vector<float> want(count);
                for (size_t i = 0; i < count; ++i) want[i] = x[i] * s;
                CHECK(bits_of(std::vector<float>(got.begin() + offset, got.begin() + offset + static_cast<ptrdiff_t>(count))) ==
                      bits_of(want));
                CHECK(got[offset == 0 ? count : 0] == 0.0f);   // nothing outside the n elements is written
            }
        }
    }
}

TEST_CASE("swiglu_oai matches swiglu_oai_f32 within 2e-6 (the device's expf), clamps and NaN included") {
    // Gate and up of N(0, 6^2): a third of each past gpt-oss's limit of 7, so both clamps are taken.
    for (int64_t n : {int64_t{1}, int64_t{33}, int64_t{2048 + 7}}) {
        for (int offset : {0, 1}) {
            CAPTURE(n);
            CAPTURE(offset);
            const size_t count = static_cast<size_t>(n);
            std::vector<float> gate = tern::test::random_normal(count, 41, 6.0f);
            std::vector<float> up = tern::test::random_normal(count, 42, 6.0f);
            if (count > 3) {
                gate[1] = std::numeric_limits<float>::quiet_NaN();   // a NaN stays one through either clamp
                up[2] = std::numeric_limits<float>::quiet_NaN();
            }
            std::vector<float> want(count);
            tern::swiglu_oai_f32(gate.data(), up.data(), want.data(), n, 1.702f, 7.0f, 1);
            std::vector<float> padded_g(count + 1, 0.0f), padded_u(count + 1, 0.0f);
            std::copy(gate.begin(), gate.end(), padded_g.begin() + offset);
            std::copy(up.begin(), up.end(), padded_u.begin() + offset);
            DeviceArray<float> dg(padded_g), du(padded_u);
            tern::cuda::swiglu_oai(dg.get() + offset, du.get() + offset, dg.get() + offset, n, nullptr);
            const std::vector<float> all = dg.read();
            std::vector<float> got(all.begin() + offset, all.begin() + offset + static_cast<ptrdiff_t>(count));
            for (size_t i = 0; i < count; ++i) {
                CAPTURE(i);
                REQUIRE(std::isnan(got[i]) == std::isnan(want[i]));
                if (std::isnan(want[i])) got[i] = want[i] = 0.0f;
            }
            CHECK(normalised_error(got, want) <= 2e-6);
        }
    }
}

TEST_CASE("argmax_rows and argmax_rows_split pick the CPU's index: planted ties across threads, warps and "
          "blocks, signed zeros, infinities") {
    struct Row {
        const char* what;
        std::vector<float> values;
    };
    for (int64_t width : {int64_t{1}, int64_t{31}, int64_t{33}, int64_t{640}, int64_t{2048 + 7}, int64_t{32000},
                          int64_t{262144}}) {
        CAPTURE(width);
        const auto w = static_cast<size_t>(width);
        std::mt19937 rng(static_cast<uint32_t>(width));
        std::uniform_real_distribution<float> uniform(-10.0f, 10.0f);
        auto random_row = [&] {
            std::vector<float> v(w);
            for (float& x : v) x = uniform(rng);
            return v;
        };
        std::vector<Row> rows;
        rows.push_back({"random", random_row()});
        // The maximum planted at several places: the lowest must win. Positions that different threads see
        // in different orders (a later unit of a low thread against an early unit of a high thread), in
        // different warps, in different 4096-float slices, and the row's ends.
        const std::vector<std::vector<size_t>> plants = {{w - 1, 0},         {w - 1, w / 2},
                                                         {1024 * 4, 5},      {4096 * 3 + 1, 4096 + 2, 40000},
                                                         {33, 32, 31},       {w / 3, w / 3 + 1, w - 2}};
        for (const std::vector<size_t>& at : plants) {
            std::vector<float> v = random_row();
            for (size_t p : at) v[std::min(p, w - 1)] = 20.0f;
            rows.push_back({"planted ties", v});
        }
        {   // Ties at random places, many of them.
            std::vector<float> v = random_row();
            for (int k = 0; k < 50; ++k) v[rng() % w] = 11.0f;
            rows.push_back({"50 random ties", v});
        }
        {   // All negative but a -0.0 and a later +0.0 (equal: the first wins), and the other way round.
            std::vector<float> v = random_row();
            for (float& x : v) x = -std::abs(x) - 1.0f;
            std::vector<float> u = v;
            v[w / 2] = -0.0f;
            v[w - 1] = 0.0f;
            u[w / 2] = 0.0f;
            u[w - 1] = -0.0f;
            rows.push_back({"-0 then +0", v});
            rows.push_back({"+0 then -0", u});
        }
        rows.push_back({"all -inf", std::vector<float>(w, -std::numeric_limits<float>::infinity())});
        rows.push_back({"all equal", std::vector<float>(w, 3.0f)});
        {
            std::vector<float> v = random_row();
            v[w - 1] = std::numeric_limits<float>::infinity();
            v[(w - 1) / 2] = std::numeric_limits<float>::infinity();
            v[0] = std::numeric_limits<float>::max();
            rows.push_back({"+inf twice", v});
        }
        {
            std::vector<float> v = random_row();
            v[0] = 15.0f; // at index 0, no tie
            rows.push_back({"max first", v});
        }

        std::vector<float> all;
        std::vector<int32_t> want;
        for (const Row& r : rows) {
            all.insert(all.end(), r.values.begin(), r.values.end());
            want.push_back(cpu_argmax(r.values.data(), width));
        }
        const auto n_rows = static_cast<int64_t>(rows.size());
        for (int offset : {0, 1}) {
            CAPTURE(offset);
            DeviceArray<float> dx(all.size() + 1);
            std::vector<float> padded(all.size() + 1, 0.0f);
            std::copy(all.begin(), all.end(), padded.begin() + offset);
            dx.write(padded);
            DeviceArray<int32_t> dout(rows.size());
            const size_t scratch_bytes = static_cast<size_t>(tern::cuda::argmax_rows_split_scratch_bytes(n_rows, width));
            DeviceArray<uint64_t> scratch(scratch_bytes / sizeof(uint64_t));

            tern::cuda::argmax_rows(dx.get() + offset, n_rows, width, dout.get(), nullptr);
            const std::vector<int32_t> got = dout.read();
            tern::cuda::argmax_rows_split(dx.get() + offset, n_rows, width, dout.get(), scratch.get(), nullptr);
            const std::vector<int32_t> got_split = dout.read();
            for (size_t r = 0; r < rows.size(); ++r) {
                CAPTURE(rows[r].what);
                CHECK(got[r] == want[r]);
                CHECK(got_split[r] == want[r]);
            }
        }
    }
}

TEST_CASE("scan_rows flags each row as scan_floats does: NaN, +inf and finite values in any slice, -inf none") {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t width : {int64_t{1}, int64_t{33}, int64_t{4096 + 5}, int64_t{262144}}) {
        CAPTURE(width);
        const auto w = static_cast<size_t>(width);
        std::vector<std::vector<float>> rows;
        rows.emplace_back(w, 0.5f);
        for (size_t at : {size_t{0}, w / 2, w - 1}) {
            for (float bad : {nan, -nan, inf, -inf}) {
                std::vector<float> v(w, -1.5f);
                v[at] = bad;
                rows.push_back(v);
            }
        }
        rows.emplace_back(w, -inf);
        std::vector<float> mixed(w, -inf);   // NaN and +inf in different slices, nothing finite
        mixed[w - 1] = nan;
        mixed[0] = inf;
        rows.push_back(mixed);
        std::vector<float> all;
        for (const std::vector<float>& r : rows) all.insert(all.end(), r.begin(), r.end());
        DeviceArray<float> dx(all.size());
        dx.write(all);
        DeviceArray<uint32_t> flags(rows.size());
        tern::cuda::scan_rows(dx.get(), static_cast<int64_t>(rows.size()), width, flags.get(), nullptr);
        const std::vector<uint32_t> got = flags.read();
        for (size_t r = 0; r < rows.size(); ++r) {
            CAPTURE(r);
            const tern::FloatScan want = tern::scan_floats(rows[r]);
            CHECK(((got[r] & tern::cuda::kRowHasNan) != 0) == want.nan);
            CHECK(((got[r] & tern::cuda::kRowHasPosInf) != 0) == want.pos_inf);
            CHECK(((got[r] & tern::cuda::kRowHasFinite) != 0) == want.finite);
        }
    }
}

TEST_CASE("argmax_rows_split_scratch_bytes: one key per 4096-float slice of each row") {
    CHECK(tern::cuda::argmax_rows_split_scratch_bytes(1, 1) == 8);
    CHECK(tern::cuda::argmax_rows_split_scratch_bytes(3, 4096) == 24);
    CHECK(tern::cuda::argmax_rows_split_scratch_bytes(2, 262144) == 2 * 64 * 8);
}

TEST_CASE("the launchers refuse shapes they cannot run and do nothing for empty ones") {
    CHECK_THROWS_AS(tern::cuda::argmax_rows(nullptr, 1, 0, nullptr, nullptr), std::invalid_argument);
    CHECK_THROWS_AS(tern::cuda::rmsnorm_rows(nullptr, nullptr, nullptr, -1, 4, kEps, nullptr), std::invalid_argument);
    CHECK_THROWS_AS(tern::cuda::softcap(nullptr, 4, 0.0f, nullptr), std::invalid_argument);
    CHECK_NOTHROW(tern::cuda::rmsnorm_rows(nullptr, nullptr, nullptr, 0, 4096, kEps, nullptr));
    CHECK_NOTHROW(tern::cuda::swiglu(nullptr, nullptr, nullptr, 0, nullptr));
    CHECK_NOTHROW(tern::cuda::argmax_rows(nullptr, 0, 8, nullptr, nullptr));
}
