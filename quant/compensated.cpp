// Error-compensating quantization (see compensated.h). The factorizations run in double: H of a
// 2048-wide input spans many orders of magnitude, and U is applied thousands of times per row.
#include "quant/compensated.h"

#include <cmath>
#include <string>

#include "base/error.h"
#include "quant/blocks.h"
#include "quant/fp8.h"
#include "quant/reference.h"

namespace tern {
namespace {

// sum a[k] b[k] in a fixed order: four interleaved partial sums, which the compiler can keep in vector
// registers without -ffast-math (a plain running sum cannot be vectorized without reordering it).
double dot(const double* a, const double* b, int64_t n) {
    double s[4] = {0.0, 0.0, 0.0, 0.0};
    int64_t k = 0;
    for (; k + 4 <= n; k += 4)
        for (int l = 0; l < 4; ++l) s[l] += a[k + l] * b[k + l];
    double t = (s[0] + s[1]) + (s[2] + s[3]);
    for (; k < n; ++k) t += a[k] * b[k];
    return t;
}

// Lower Cholesky factor of the n x n symmetric a (row-major; only its lower half is read), in place,
// column by column: once L[j][j] is known, each entry below it is a dot product of two finished row
// prefixes. False when a pivot is not positive: a is not positive definite in floating point.
bool cholesky_lower(std::vector<double>& a, int64_t n) {
    for (int64_t j = 0; j < n; ++j) {
        double* rj = a.data() + j * n;
        const double pivot = rj[j] - dot(rj, rj, j);
        if (!(pivot > 0.0) || !std::isfinite(pivot)) return false;
        rj[j] = std::sqrt(pivot);
        const double inv = 1.0 / rj[j];
        for (int64_t i = j + 1; i < n; ++i) {
            double* ri = a.data() + i * n;
            ri[j] = (ri[j] - dot(ri, rj, j)) * inv;
        }
    }
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = i + 1; j < n; ++j) a[static_cast<size_t>(i * n + j)] = 0.0;
    return true;
}

// (L L^T)^-1 = L^-T L^-1 for a lower triangular L, lower half. Column j of L^-1 solves L y = e_j
// (y_k = 0 for k < j), independently of the other columns; they are kept as rows t[j] of its transpose,
// so the result's (a, b) entry, b <= a, is the dot product of t[a] and t[b] over k >= a. (Single-threaded,
// like the factorization: splitting its columns over threads needs a barrier per column, which stalled
// 10x when the cores were busy with other work; a 2048-wide factor takes about 3 s.)
std::vector<double> inverse_from_cholesky(const std::vector<double>& l, int64_t n) {
    std::vector<double> t(l.size(), 0.0), out(l.size(), 0.0);
    for (int64_t j = 0; j < n; ++j) {
        double* y = t.data() + j * n;
        y[j] = 1.0 / l[static_cast<size_t>(j * n + j)];
        for (int64_t i = j + 1; i < n; ++i) {
            const double* li = l.data() + i * n;
            y[i] = -dot(li + j, y + j, i - j) / li[i];
        }
    }
    for (int64_t a = 0; a < n; ++a)
        for (int64_t b = 0; b <= a; ++b)
            out[static_cast<size_t>(a * n + b)] = dot(t.data() + a * n + a, t.data() + b * n + a, n - a);
    return out;
}

void check_finite(const float* x, int64_t n, const char* what) {
    for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(x[i]))
            throw InputError(std::string(what) + " holds a non-finite value at index " + std::to_string(i));
}

void quantize_row_f8_compensated(const float* src, BlockF8_E4M3* out, const CompensationFactor& f) {
    const int64_t n = f.width;
    std::vector<float> w(src, src + n);
    for (int64_t b = 0; b < n / QK_F8; ++b) {
        BlockF8_E4M3& blk = out[b];
        const int64_t j0 = b * QK_F8;
        quantize_block_f8_e4m3(w.data() + j0, blk, F8Search::full);
        const float d = f16_to_f32(blk.d), id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int64_t j = j0; j < j0 + QK_F8; ++j) {
            // The same rounding as the reference encoder, of the value after the earlier errors moved in
            // (a zero scale keeps the search's zero codes).
            if (d != 0.0f) blk.qs[j - j0] = f32_to_e4m3(w[static_cast<size_t>(j)] * id);
            const float* uj = f.u.data() + j * n;
            const float e = (w[static_cast<size_t>(j)] - d * e4m3_to_f32(blk.qs[j - j0])) / uj[j];
            for (int64_t k = j + 1; k < n; ++k) w[static_cast<size_t>(k)] -= e * uj[k];
        }
    }
}

} // namespace

bool supports_compensation(GgmlType type) { return type == GgmlType::F8_E4M3; }

CompensationFactor compensation_factor(const float* moments, int64_t width) {
    check_finite(moments, width * width, "the calibration moments");
    const auto n = static_cast<size_t>(width);
    double mean_diag = 0.0;
    for (size_t i = 0; i < n; ++i) mean_diag += moments[i * n + i];
    mean_diag = n ? mean_diag / static_cast<double>(n) : 0.0;
    // A matrix that never saw a non-zero input: any damping gives the plain rounding (U diagonal).
    double damp = 0.01 * (mean_diag > 0.0 ? mean_diag : 1.0);
    std::vector<double> h(n * n);
    for (int attempt = 0; attempt < 8; ++attempt, damp *= 10.0) {
        for (size_t i = 0; i < n * n; ++i) h[i] = moments[i];
        for (size_t i = 0; i < n; ++i) h[i * n + i] += damp;
        if (!cholesky_lower(h, width)) continue;
        std::vector<double> inv = inverse_from_cholesky(h, width);
        if (!cholesky_lower(inv, width)) continue;
        CompensationFactor f;
        f.width = width;
        f.u.assign(n * n, 0.0f);
        for (size_t i = 0; i < n; ++i)
            for (size_t j = 0; j <= i; ++j) f.u[j * n + i] = static_cast<float>(inv[i * n + j]);   // U = L2^T
        return f;
    }
    throw InputError("the calibration moments of a " + std::to_string(width) +
                     "-wide input could not be factorized even with heavy damping (are the activations finite?)");
}

void quantize_row_compensated(GgmlType type, const float* src, void* dst, const CompensationFactor& f) {
    if (!supports_compensation(type))
        throw InputError("no error-compensating quantizer for " + std::string(type_name(type)));
    if (f.width % QK_F8 != 0)
        throw InputError("a row of " + std::to_string(f.width) + " values is not a multiple of the F8_E4M3 block (32)");
    check_finite(src, f.width, "the row");
    quantize_row_f8_compensated(src, static_cast<BlockF8_E4M3*>(dst), f);
}

} // namespace tern
