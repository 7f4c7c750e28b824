// edit-gemm-bench: the machine's matmul rate with LibTorch on CPU, at the shapes of one
// training step of a Llama-style model (forward + both backward products of every linear
// layer, and the attention score/value batched products) and at 2048^3.
//
//   edit-gemm-bench [--tokens 512] [--dim 128] [--ffn 352] [--vocab 256] [--layers 4]
//                   [--heads 4] [--seq 128] [--threads 1,2] [--min-seconds 0.3]
//
// Prints one JSON object per line: {"kind":"shape",...} for each shape and thread count,
// {"kind":"model",...} for the FLOP-weighted rate of a whole step's matmuls (total matmul
// FLOPs / total time), and {"kind":"square",...} for 2048^3. The benchmark driver
// (bench/run.py) reads these lines.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

struct Shape {
  std::string name;
  int64_t batch, m, k, n;  // batch x (m x k) @ (k x n)
  int count;               // how many such products one training step does
};

// Seconds per call of C = A @ B (batched when batch > 1), measured for at least minSeconds.
double timeMatmul(const Shape& s, double minSeconds) {
  auto a = s.batch > 1 ? at::randn({s.batch, s.m, s.k}) : at::randn({s.m, s.k});
  auto b = s.batch > 1 ? at::randn({s.batch, s.k, s.n}) : at::randn({s.k, s.n});
  auto c = s.batch > 1 ? at::empty({s.batch, s.m, s.n}) : at::empty({s.m, s.n});
  auto run = [&] {
    if (s.batch > 1) at::bmm_out(c, a, b);
    else at::mm_out(c, a, b);
  };
  for (int i = 0; i < 3; ++i) run();  // warm-up: page in, let BLAS size its buffers
  int64_t iters = 0;
  const double t0 = now();
  double t = t0;
  do {
    run();
    ++iters;
    t = now();
  } while (t - t0 < minSeconds);
  return (t - t0) / static_cast<double>(iters);
}

// LibTorch's at::set_num_threads does not reach OpenBLAS's own thread pool (Debian's
// LibTorch 1.13 with openblas-pthread): set it too when the symbol is there.
bool setBlasThreads(int n) {
  using Fn = void (*)(int);
  static Fn fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (fn) fn(n);
  return fn != nullptr;
}

std::vector<int> parseList(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::atoi(item.c_str()));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 512, dim = 128, ffn = 352, vocab = 256, layers = 4, heads = 4, seq = 128;
  std::vector<int> threads = {1, 2};
  double minSeconds = 0.3;
  int64_t square = 2048;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "edit-gemm-bench: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokens") tokens = std::atoll(next().c_str());
    else if (a == "--dim") dim = std::atoll(next().c_str());
    else if (a == "--ffn") ffn = std::atoll(next().c_str());
    else if (a == "--vocab") vocab = std::atoll(next().c_str());
    else if (a == "--layers") layers = std::atoll(next().c_str());
    else if (a == "--heads") heads = std::atoll(next().c_str());
    else if (a == "--seq") seq = std::atoll(next().c_str());
    else if (a == "--threads") threads = parseList(next());
    else if (a == "--min-seconds") minSeconds = std::atof(next().c_str());
    else if (a == "--square") square = std::atoll(next().c_str());
    else {
      std::cerr << "usage: edit-gemm-bench [--tokens N] [--dim D] [--ffn F] [--vocab V] "
                   "[--layers L] [--heads H] [--seq T] [--threads 1,2] [--min-seconds S] "
                   "[--square 2048]\n";
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }

  // A linear layer y = x W^T with x [tokens, in], W [out, in] does three products per step:
  // forward [tokens,in]@[in,out], input gradient [tokens,out]@[out,in], weight gradient
  // [out,tokens]@[tokens,in]. Counts are per step of the whole model.
  std::vector<Shape> shapes;
  auto linear = [&](const std::string& name, int64_t in, int64_t out, int count) {
    shapes.push_back({name + ".fwd", 1, tokens, in, out, count});
    shapes.push_back({name + ".dgrad", 1, tokens, out, in, count});
    shapes.push_back({name + ".wgrad", 1, out, tokens, in, count});
  };
  const int L = static_cast<int>(layers);
  linear("attn_proj", dim, dim, 4 * L);    // wq, wk, wv, wo
  linear("ffn_up", dim, ffn, 2 * L);       // w1, w3
  linear("ffn_down", ffn, dim, L);         // w2
  linear("output", dim, vocab, 1);
  // Attention per (sequence, head): forward scores S = Q K^T ([T,hd]@[hd,T]) and values
  // O = P V ([T,T]@[T,hd]); backward dP = dO V^T (scores-like), dV = P^T dO, dQ = dS K,
  // dK = dS^T Q (values-like): 2 scores-like and 4 values-like products per layer.
  const int64_t hd = dim / heads, bh = (tokens / seq) * heads;
  if (bh > 0) {
    shapes.push_back({"attn_scores", bh, seq, hd, seq, 2 * L});
    shapes.push_back({"attn_values", bh, seq, seq, hd, 4 * L});
  }

  for (int th : threads) {
    at::set_num_threads(th);
    const bool blasSet = setBlasThreads(th);
    double flops = 0, seconds = 0;
    for (const auto& s : shapes) {
      const double t = timeMatmul(s, minSeconds);
      const double f = 2.0 * s.batch * s.m * s.k * s.n;
      flops += f * s.count;
      seconds += t * s.count;
      std::printf("{\"kind\":\"shape\",\"name\":\"%s\",\"threads\":%d,\"batch\":%lld,\"m\":%lld,"
                  "\"k\":%lld,\"n\":%lld,\"count\":%d,\"seconds\":%.6e,\"gflops\":%.3f}\n",
                  s.name.c_str(), th, static_cast<long long>(s.batch),
                  static_cast<long long>(s.m), static_cast<long long>(s.k),
                  static_cast<long long>(s.n), s.count, t, f / t / 1e9);
      std::fflush(stdout);
    }
    std::printf("{\"kind\":\"model\",\"threads\":%d,\"openblas_threads_set\":%s,\"tokens\":%lld,"
                "\"step_matmul_flops\":%.6e,\"step_matmul_seconds\":%.6e,\"gflops\":%.3f}\n",
                th, blasSet ? "true" : "false", static_cast<long long>(tokens), flops, seconds,
                flops / seconds / 1e9);
    if (square > 0) {
      const Shape sq{"square", 1, square, square, square, 1};
      const double t = timeMatmul(sq, minSeconds);
      std::printf("{\"kind\":\"square\",\"threads\":%d,\"size\":%lld,\"seconds\":%.6e,"
                  "\"gflops\":%.3f}\n",
                  th, static_cast<long long>(square), t,
                  2.0 * square * square * square / t / 1e9);
    }
    std::fflush(stdout);
  }
  return 0;
}
