// The int8 tensor-core prefill matmul (kernels/cuda/gemm_q8.h).
//
// Tiles. A thread block computes 128 weight rows (outputs) x 64 activation columns (tokens) with 4 warps,
// each 64 rows x 32 columns: 4 x 4 mma tiles of 16 x 8 (A = the weights, B = the activations), 64 f32
// accumulators a lane. The k loop goes 128 elements (4 blocks of 32) a step: the block decodes the weight
// tile into shared memory once (q8_dot.cuh's unit loaders: codes as signed bytes, the block's scales) and
// copies the activation tile beside it; every weight byte then meets all 64 columns, every activation
// byte all 128 rows, through ldmatrix and mma.sync. 128 x 64 keeps the grid of a 512-token prefill of a
// 4096-row matrix at 256 blocks (an H100 has 132 SMs) and decodes each weight block once per 64 tokens.
// Several blocks share an SM (TERN_GEMM_Q8_MIN_BLOCKS below), so one block's loads and decoding overlap
// the others' mma work (there is no software pipelining inside a block).
//
// The k order in shared memory is each block's natural element order (codes of elements 0 .. 31 in 32
// bytes), into which the activations' unit order (matmul_q8.h) is permuted on the way in: a 32-block is
// then one m16n8k32 fragment whose k 0 .. 15 and 16 .. 31 halves are the two 16-element groups Q3_K and
// Q6_K scale separately, two m16n8k16 fragments with no reloading (mma.h).
//
// Scaling. Per 32-element block, with D the integer dot product, the f32 accumulator takes
// dx * (d * D + m * S) in matmul_q8's order of roundings (q8_dot.cuh accumulate; here per block, there per
// 16-element unit). The conversion of D is folded into the mma: its accumulator starts at the bits of
// 1.5 * 2^23, so the s32 result read as a float is 1.5 * 2^23 + D exactly (|D| < 2^22), and
// fma(d, that, -1.5 * 2^23 * d) = d * D rounded once, as __fmul_rn(d, float(D)) (-1.5 * 2^23 * d is exact:
// d has at most 17 significant bits). So a plain block costs each output two FMAs, an offset format three.
// Q6_K's sums reach 2^24 and take I2F (exact below 2^24 and at it).
//
// Ragged edges: rows past n_out and columns past n_cols repeat the last one (their results are not
// stored), and warps skip the mma tiles that lie wholly past them; the last k step may hold fewer blocks.
#include "kernels/cuda/gemm_q8.h"

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/column_passes.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/matmul_q8.h"
#include "kernels/cuda/mma.h"
#include "kernels/cuda/q8_dot.cuh"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {
namespace {

constexpr int kTileRows = 128;                          // weight rows (outputs) a block
constexpr int kTileCols = 64;                           // activation columns (tokens) a block
constexpr int kStepBlocks = 4;                          // 32-element blocks a k step
constexpr int kWarpsM = 2, kWarpsN = 2;                 // warps along rows and columns
constexpr int kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kMTiles = kTileRows / kWarpsM / 16;       // m16 tiles a warp (4)
constexpr int kNTiles = kTileCols / kWarpsN / 8;        // n8 tiles a warp (4)
// Bytes of a row of codes in shared memory: 16 more than a step's 128 shift consecutive rows by 4 banks,
// so ldmatrix's eight 16-byte rows fall in distinct banks.
constexpr int kRowStride = 32 * kStepBlocks + 16;

// Blocks an SM keeps resident, which sets the register budget: three on sm_80, sm_87 and sm_90, whose 164
// / 228 KiB of shared memory hold three blocks of 35 KiB (the formats take 122 to 158 registers a thread
// there; a cap of 128 for four blocks spilled Q2_K on sm_80); two elsewhere: the SMs of sm_86, sm_89 and
// sm_120 hold two blocks' shared memory, and the sm_100 / sm_120 code takes up to 255 registers (it spilled
// Q3_K and Q5_K at the 168 of three blocks). scripts/cuda_arch_check.sh shows them.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 800 || __CUDA_ARCH__ == 870 || __CUDA_ARCH__ == 900)
#define TERN_GEMM_Q8_MIN_BLOCKS 3
#else
#define TERN_GEMM_Q8_MIN_BLOCKS 2
#endif

constexpr int kMagic = 0x4B400000;           // the bits of 1.5 * 2^23
constexpr float kMagicValue = 12582912.0f;   // 1.5 * 2^23

// Shared memory, in bytes from the start: codes, then per-block weight scales [row][block] (one row's four
// blocks side by side: the decode writes and the epilogue reads them without bank conflicts), then
// per-block activation scales [block][column] (a lane reads its two adjacent columns at once).
constexpr int kWeightCodes = 0;
constexpr int kActCodes = kWeightCodes + kTileRows * kRowStride;
constexpr int kWeightD = kActCodes + kTileCols * kRowStride;       // f32 d
constexpr int kWeightM = kWeightD + 4 * kTileRows * kStepBlocks;   // f32 m (offset formats)
constexpr int kWeightAux = kWeightM + 4 * kTileRows * kStepBlocks; // u32: Q3_K / Q6_K's two scales, Q2_K's mins
constexpr int kActD = kWeightAux + 4 * kTileRows * kStepBlocks;    // f32 dx
constexpr int kActS = kActD + 4 * kTileCols * kStepBlocks;         // f32 S, or Q2_K's two int16 sums
constexpr int kSharedBytes = kActS + 4 * kTileCols * kStepBlocks;
static_assert(kSharedBytes <= 48 * 1024, "static launch limit of dynamic shared memory");

// What the block's scaling needs of a format (q8_dot.cuh's traits, per 32-element block).
template <GgmlType T> struct BlockTraits {
    using Unit = q8dot::Q8Unit<T>;
    static constexpr bool kTwoScales = Unit::kTwoScales;    // D = sc0 * D(k 0..15) + sc1 * D(k 16..31)
    static constexpr bool kOffset = Unit::kOffset;          // the m * S term
    static constexpr bool kMinBytes = T == GgmlType::Q2_K;  // S weighs the halves' sums by the weight's mins
    static constexpr int kMaxBlockDot = 2 * Unit::kMaxDot;  // |D| of a block, for |codes| <= 128
    static_assert(kMaxBlockDot <= (1 << 24), "a block's dot product must be exact in f32");
    static constexpr bool kMagicConversion = kMaxBlockDot < (1 << 22);
};

__device__ __forceinline__ int low_half(uint32_t v) { return static_cast<int16_t>(v & 0xFFFFu); }
__device__ __forceinline__ int high_half(uint32_t v) { return static_cast<int>(v) >> 16; }

// Weight rows row0 .. row0 + 127, blocks block0 .. block0 + 3 (those below n_blocks) into shared memory.
template <GgmlType T>
__device__ __forceinline__ void decode_weights(const uint8_t* __restrict__ w, int64_t row_bytes, int n_out,
                                               int row0, int block0, int n_blocks, uint8_t* smem) {
    using Tr = BlockTraits<T>;
    TERN_UNROLL
    for (int it = 0; it < kTileRows * kStepBlocks / kThreads; ++it) {
        const int item = static_cast<int>(threadIdx.x) + kThreads * it;
        const int r = item / kStepBlocks, kb = item % kStepBlocks, block = block0 + kb;
        if (block >= n_blocks) continue;
        const uint8_t* row = w + static_cast<int64_t>(min(row0 + r, n_out - 1)) * row_bytes;
        q8dot::WeightUnit u0, u1;
        Tr::Unit::load(row, 2 * block, u0);
        Tr::Unit::load(row, 2 * block + 1, u1);
        // Unit h's first 8 codes are elements 8h .. 8h + 7, its last 8 elements 16 + 8h .. 16 + 8h + 7.
        uint8_t* codes = smem + kWeightCodes + r * kRowStride + 32 * kb;
        *reinterpret_cast<uint4*>(codes) = make_uint4(static_cast<uint32_t>(u0.q[0]), static_cast<uint32_t>(u0.q[1]),
                                                      static_cast<uint32_t>(u1.q[0]), static_cast<uint32_t>(u1.q[1]));
        *reinterpret_cast<uint4*>(codes + 16) =
            make_uint4(static_cast<uint32_t>(u0.q[2]), static_cast<uint32_t>(u0.q[3]), static_cast<uint32_t>(u1.q[2]),
                       static_cast<uint32_t>(u1.q[3]));
        // Both units of a block share its scales (a 32-element block or sub-block).
        reinterpret_cast<float*>(smem + kWeightD)[item] = u0.d;
        if constexpr (Tr::kOffset) reinterpret_cast<float*>(smem + kWeightM)[item] = u0.m;
        if constexpr (Tr::kTwoScales)
            reinterpret_cast<uint32_t*>(smem + kWeightAux)[item] =
                (static_cast<uint32_t>(u0.sc[0]) & 0xFFFFu) | (static_cast<uint32_t>(u0.sc[1]) << 16);
        if constexpr (Tr::kMinBytes) reinterpret_cast<uint32_t*>(smem + kWeightAux)[item] = u0.min_bytes;
    }
}

// Activation columns col0 .. col0 + 63, blocks block0 .. block0 + 3 into shared memory, codes in natural
// order, with each block's scale and the sums of its two 16-element halves.
template <GgmlType T>
__device__ __forceinline__ void load_activations(const uint8_t* __restrict__ xq, int64_t column_bytes, int n_in,
                                                 int n_cols, int col0, int block0, int n_blocks, uint8_t* smem) {
    using Tr = BlockTraits<T>;
    TERN_UNROLL
    for (int it = 0; it < kTileCols * kStepBlocks / kThreads; ++it) {
        const int item = static_cast<int>(threadIdx.x) + kThreads * it;
        const int c = item / kStepBlocks, kb = item % kStepBlocks, block = block0 + kb;
        if (block >= n_blocks) continue;
        const uint8_t* col = xq + static_cast<int64_t>(min(col0 + c, n_cols - 1)) * column_bytes;
        const uint4 u0 = *reinterpret_cast<const uint4*>(col + 32 * block);
        const uint4 u1 = *reinterpret_cast<const uint4*>(col + 32 * block + 16);
        uint8_t* codes = smem + kActCodes + c * kRowStride + 32 * kb;
        *reinterpret_cast<uint4*>(codes) = make_uint4(u0.x, u0.y, u1.x, u1.y);
        *reinterpret_cast<uint4*>(codes + 16) = make_uint4(u0.z, u0.w, u1.z, u1.w);
        // Units 2b and 2b + 1: {d, first-8 sum | last-8 sum << 16} each; d is the block's.
        const uint4 meta = *reinterpret_cast<const uint4*>(col + n_in + 16 * block);
        const int slot = kb * kTileCols + c;
        reinterpret_cast<uint32_t*>(smem + kActD)[slot] = meta.x;
        if constexpr (Tr::kOffset) {
            const int first = low_half(meta.y) + low_half(meta.w);   // elements 0 .. 15
            const int last = high_half(meta.y) + high_half(meta.w);  // elements 16 .. 31
            if constexpr (Tr::kMinBytes)
                reinterpret_cast<uint32_t*>(smem + kActS)[slot] =
                    (static_cast<uint32_t>(first) & 0xFFFFu) | (static_cast<uint32_t>(last) << 16);
            else   // |S| <= 32 * 128: exact
                reinterpret_cast<float*>(smem + kActS)[slot] = static_cast<float>(first + last);
        }
    }
}

template <GgmlType T>
__global__ void __launch_bounds__(kThreads, TERN_GEMM_Q8_MIN_BLOCKS)
    gemm_q8_tiles(const uint8_t* __restrict__ w, int64_t row_bytes, int n_out, int n_in,
                  const uint8_t* __restrict__ xq, int n_cols, const float* __restrict__ bias, float* __restrict__ y) {
    using Tr = BlockTraits<T>;
    uint8_t* smem = dynamic_shared<uint8_t>();
    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    const int g = lane / 4, t = lane % 4;
    const int wm = warp % kWarpsM, wn = warp / kWarpsM;
    const int col0 = static_cast<int>(blockIdx.x) * kTileCols, row0 = static_cast<int>(blockIdx.y) * kTileRows;
    const int n_blocks = n_in / 32;
    const int64_t column_bytes = q8_column_bytes(n_in);

    // Which of the warp's mma tiles hold a row / column of the output (warp-uniform).
    const int warp_row0 = wm * (16 * kMTiles), warp_col0 = wn * (8 * kNTiles);
    bool m_live[kMTiles], n_live[kNTiles];
    TERN_UNROLL
    for (int i = 0; i < kMTiles; ++i) m_live[i] = row0 + warp_row0 + 16 * i < n_out;
    TERN_UNROLL
    for (int i = 0; i < kNTiles; ++i) n_live[i] = col0 + warp_col0 + 8 * i < n_cols;

    // ldmatrix addresses (mma.h): for A, lane l gives row 8 ((l / 8) % 2) + l % 8 at byte 16 (l / 16) of the
    // block, matrices a[0] .. a[3]; for B, column 8 (l / 16) + l % 8 at byte 16 ((l / 8) % 2), matrices b[0],
    // b[1] of an n8 tile and b[0], b[1] of the next.
    const uint8_t* a_lane =
        smem + kWeightCodes + (warp_row0 + 8 * ((lane / 8) % 2) + lane % 8) * kRowStride + 16 * (lane / 16);
    const uint8_t* b_lane =
        smem + kActCodes + (warp_col0 + 8 * (lane / 16) + lane % 8) * kRowStride + 16 * ((lane / 8) % 2);
    const float* w_d = reinterpret_cast<const float*>(smem + kWeightD);
    const float* w_m = reinterpret_cast<const float*>(smem + kWeightM);
    const uint32_t* w_aux = reinterpret_cast<const uint32_t*>(smem + kWeightAux);
    const float* x_d = reinterpret_cast<const float*>(smem + kActD);
    const uint32_t* x_s = reinterpret_cast<const uint32_t*>(smem + kActS);

    float acc[kMTiles][kNTiles][4];
    TERN_UNROLL
    for (int i = 0; i < kMTiles; ++i)
        TERN_UNROLL
        for (int j = 0; j < kNTiles; ++j)
            TERN_UNROLL
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    TERN_NO_UNROLL
    for (int block0 = 0; block0 < n_blocks; block0 += kStepBlocks) {
        __syncthreads();   // the previous step's tiles are read
        decode_weights<T>(w, row_bytes, n_out, row0, block0, n_blocks, smem);
        load_activations<T>(xq, column_bytes, n_in, n_cols, col0, block0, n_blocks, smem);
        __syncthreads();
        const int step_blocks = min(kStepBlocks, n_blocks - block0);
        TERN_NO_UNROLL
        for (int kb = 0; kb < step_blocks; ++kb) {
            // The warp's activation fragments and the scales of its lane's columns 2t, 2t + 1 of each n8 tile.
            // (Zeroed: the tiles past n_cols skip their loads, and the compilers cannot see that they skip
            // their mma too.)
            uint32_t b[kNTiles][2] = {};
            float dx[kNTiles][2];
            uint32_t s[kNTiles][2] = {};
            TERN_UNROLL
            for (int j = 0; j < kNTiles; j += 2) {
                if (!n_live[j]) continue;
                uint32_t r[4];
                ldmatrix_x4(r, b_lane + 8 * j * kRowStride + 32 * kb);
                b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
            }
            TERN_UNROLL
            for (int j = 0; j < kNTiles; ++j) {
                const int slot = kb * kTileCols + warp_col0 + 8 * j + 2 * t;
                const float2 d2 = *reinterpret_cast<const float2*>(x_d + slot);
                dx[j][0] = d2.x, dx[j][1] = d2.y;
                if constexpr (Tr::kOffset) {
                    const uint2 s2 = *reinterpret_cast<const uint2*>(x_s + slot);
                    s[j][0] = s2.x, s[j][1] = s2.y;
                }
            }
            TERN_UNROLL
            for (int i = 0; i < kMTiles; ++i) {
                if (!m_live[i]) continue;
                uint32_t a[4];
                ldmatrix_x4(a, a_lane + 16 * i * kRowStride + 32 * kb);
                // The lane's rows g and g + 8 of this m16 tile.
                float d[2], d_magic[2], m[2];
                uint32_t aux[2];
                TERN_UNROLL
                for (int h = 0; h < 2; ++h) {
                    const int slot = (warp_row0 + 16 * i + g + 8 * h) * kStepBlocks + kb;
                    d[h] = w_d[slot];
                    d_magic[h] = __fmul_rn(-kMagicValue, d[h]);
                    if constexpr (Tr::kOffset) m[h] = w_m[slot];
                    if constexpr (Tr::kTwoScales || Tr::kMinBytes) aux[h] = w_aux[slot];
                }
                TERN_UNROLL
                for (int j = 0; j < kNTiles; ++j) {
                    if (!n_live[j]) continue;
                    int dot[4];
                    if constexpr (!Tr::kTwoScales) {
                        const int c[4] = {kMagic, kMagic, kMagic, kMagic};
                        mma_m16n8k32_s32_s8(dot, a, b[j], c);
                    } else {
                        const int zero[4] = {0, 0, 0, 0};
                        int first[4], last[4];
                        mma_m16n8k16_s32_s8(first, a, b[j][0], zero);
                        mma_m16n8k16_s32_s8(last, a + 2, b[j][1], zero);
                        TERN_UNROLL
                        for (int e = 0; e < 4; ++e)
                            dot[e] = low_half(aux[e / 2]) * first[e] +
                                     (high_half(aux[e / 2]) * last[e] + (Tr::kMagicConversion ? kMagic : 0));
                    }
                    TERN_UNROLL
                    for (int e = 0; e < 4; ++e) {   // element e: row g + 8 (e / 2), column 2t + e % 2
                        const int h = e / 2, c = e % 2;
                        float v;
                        if constexpr (Tr::kMagicConversion) v = __fmaf_rn(d[h], __int_as_float(dot[e]), d_magic[h]);
                        else v = __fmul_rn(d[h], __int2float_rn(dot[e]));
                        if constexpr (Tr::kMinBytes) {
                            const int sum = __dp2a_lo(static_cast<int>(s[j][c]), static_cast<int>(aux[h]), kMagic);
                            v = __fmaf_rn(m[h], __fsub_rn(__int_as_float(sum), kMagicValue), v);
                        } else if constexpr (Tr::kOffset) {
                            v = __fmaf_rn(m[h], __uint_as_float(s[j][c]), v);
                        }
                        acc[i][j][e] = __fmaf_rn(dx[j][c], v, acc[i][j][e]);
                    }
                }
            }
        }
    }

    TERN_UNROLL
    for (int i = 0; i < kMTiles; ++i) {
        TERN_UNROLL
        for (int j = 0; j < kNTiles; ++j) {
            TERN_UNROLL
            for (int e = 0; e < 4; ++e) {
                const int row = row0 + warp_row0 + 16 * i + g + 8 * (e / 2);
                const int col = col0 + warp_col0 + 8 * j + 2 * t + e % 2;
                if (row < n_out && col < n_cols)
                    y[static_cast<int64_t>(col) * n_out + row] = bias ? acc[i][j][e] + bias[row] : acc[i][j][e];
            }
        }
    }
}

template <GgmlType T>
void launch_tiles(const uint8_t* w, int64_t n_in, int64_t n_out, const uint8_t* x, int64_t n_cols, const float* bias,
                  float* y, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>((n_cols + kTileCols - 1) / kTileCols),
                    static_cast<unsigned>((n_out + kTileRows - 1) / kTileRows));
    launch(gemm_q8_tiles<T>, grid, dim3(kThreads), kSharedBytes, stream, w, static_cast<int64_t>(row_bytes(T, n_in)),
           static_cast<int>(n_out), static_cast<int>(n_in), x, static_cast<int>(n_cols), bias, y);
}

using column_passes::check_aligned;
using column_passes::kIntMax;
using column_passes::kMaxGridY;
using column_passes::refuse;

// The current device's answer, asked once a thread and device (the properties query is slow).
bool current_device_supported() {
    thread_local int known_device = -1;
    thread_local bool known_answer = false;
    int device = 0;
    check(cudaGetDevice(&device), "gemm_q8: asking the current device");
    if (device != known_device) {
        known_answer = gemm_q8_device_supported(device);
        known_device = device;
    }
    return known_answer;
}

} // namespace

bool gemm_q8_device_supported(int device) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        cudaGetLastError();   // the failed query is not the caller's launch error
        return false;
    }
    return prop.major >= 8;
}

void gemm_q8(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const void* x_q, int64_t n_cols,
             const float* bias, float* y, cudaStream_t stream) {
    if (!matmul_q8_supports(type)) refuse("gemm_q8: format " + std::string(type_name(type)) + " is not read");
    const int64_t block = block_elems(type);
    if (n_in < 0 || n_in % block != 0)
        refuse("gemm_q8: n_in = " + std::to_string(n_in) + " is not a multiple of " + std::string(type_name(type)) +
               "'s block (" + std::to_string(block) + ")");
    if (q8_column_bytes(n_in) > kIntMax || n_out < 0 || (n_out + kTileRows - 1) / kTileRows > kMaxGridY ||
        n_cols < 0 || n_cols > kIntMax)
        refuse("gemm_q8: n_in = " + std::to_string(n_in) + ", n_out = " + std::to_string(n_out) +
               ", n_cols = " + std::to_string(n_cols) + " out of range");
    if (n_out == 0 || n_cols == 0) return;
    check_aligned("gemm_q8", w, "w");
    check_aligned("gemm_q8", x_q, "x_q");
    if (!current_device_supported()) refuse("gemm_q8: the device is below compute capability 8.0 (no int8 mma)");
    const auto* wb = static_cast<const uint8_t*>(w);
    const auto* xb = static_cast<const uint8_t*>(x_q);
    q8dot::Formats::visit(type, [&](auto tag) {
        launch_tiles<decltype(tag)::value>(wb, n_in, n_out, xb, n_cols, bias, y, stream);
    });
}

#undef TERN_GEMM_Q8_MIN_BLOCKS

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
