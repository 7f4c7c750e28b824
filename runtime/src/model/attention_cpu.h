// Causal attention on the CPU in one pass per head (flash-style): scores, softmax and the
// weighted values are computed tile by tile, never as a [T, T] tensor per head in the
// autograd graph, and the tiles above the diagonal are never computed.
//
// Why: through LibTorch ops the same attention costs 6 batched matmuls over full [T, T]
// squares, a mask pass, a softmax and its backward, each a pass over B*H*T*T floats, and
// saves the softmax for the backward. Here the forward saves one log-sum-exp per row and
// the backward recomputes the probabilities from it (about 3x faster on the tiny model,
// and the [B, H, T, T] activations per layer are gone). docs/design-decisions.md.
//
// Plain C++ over raw float pointers (no LibTorch: this file is compiled with -O3 and
// per-CPU clones of the row loops); the matrix products go to the process's BLAS sgemm_.
#pragma once

#include <cstdint>

namespace edit::cpu_attention {

// False when no BLAS sgemm_ is loaded in this process (then the caller uses LibTorch ops).
bool available();

struct Dims {
  int64_t batch, heads, seq, headDim;
};

// Heads [first, last) of the batch*heads heads, so callers can split them over threads.
//   q, k, v: [B, H, T, hd] contiguous, q already scaled by 1/sqrt(hd)
//   out:     [B, T, H*hd] (heads merged, ready for the output projection)
//   lse:     [B, H, T]    log of each row's softmax denominator, for the backward
void forward(const float* q, const float* k, const float* v, float* out, float* lse, const Dims& d,
             int64_t first, int64_t last);

// dOut: [B, T, H*hd]; writes dq, dk, dv: [B, H, T, hd] of the same heads.
void backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
              const float* dOut, float* dq, float* dk, float* dv, const Dims& d, int64_t first, int64_t last);

// Rotary tables, each [>= T, hd/2] row-major: the query's (pre-scaled by 1/sqrt(hd)) and the key's.
struct Rotary {
  const float *qcos, *qsin, *kcos, *ksin;
};

// The stacked projection's output qkv [B, T, 3, H, hd] to q and k rotated (q also scaled)
// and v, each [B, H, T, hd]: the head split, RoPE and the layout change in one pass.
void splitHeads(const float* qkv, const Rotary& r, float* q, float* k, float* v, const Dims& d, int64_t first,
                int64_t last);

// Its backward: dq and dk rotated back, and dv, into dqkv [B, T, 3, H, hd] (every element
// of the heads [first, last) written).
void mergeHeadGrads(const float* dq, const float* dk, const float* dv, const Rotary& r, float* dqkv, const Dims& d,
                    int64_t first, int64_t last);

}  // namespace edit::cpu_attention
