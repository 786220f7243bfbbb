// The native kernels as torch operators (namespace specdecode_native), built at install by setup.py.
//
// Why torch operators rather than ctypes: tensors cross the boundary with their dtypes and shapes, which are
// checked here against what the kernels read (a wrong layout is a clear error, never a read out of bounds); the
// decoder's layers are held by a torch class that keeps the weight tensors alive and owns its work buffers, so
// no C struct is mirrored by hand in Python; and the operators have Meta kernels, so torch.compile traces a packed
// model. The CPU variant is an argument: an index into variants(), chosen in Python by the CPU's features
// (native.py), so tests can force any variant this CPU runs.
#include <Python.h>

#include <ATen/ATen.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <string>
#include <vector>

#define SD_VARIANT avx2
#include "native.h"
#undef SD_VARIANT
#ifdef SD_HAS_vnni
#define SD_VARIANT vnni
#include "native.h"
#undef SD_VARIANT
#endif
#ifdef SD_HAS_avx512_vnni
#define SD_VARIANT avx512_vnni
#include "native.h"
#undef SD_VARIANT
#endif
#ifdef SD_HAS_amx
#define SD_VARIANT amx
#include "native.h"
#undef SD_VARIANT
#endif
#ifdef SD_HAS_portable
#define SD_VARIANT portable
#include "native.h"
#undef SD_VARIANT
#endif

namespace {

struct Kernels {
  const char *name;
  decltype(&avx2_quantize_activations) quantize_activations;
  decltype(&avx2_gemm_q4) gemm_q4;
  decltype(&avx2_gemm_q8) gemm_q8;
  decltype(&avx2_rms_norm_rows) rms_norm_rows;
  decltype(&avx2_decoder_layers) decoder_layers;
};

#define SD_KERNELS(V) Kernels{#V, V##_quantize_activations, V##_gemm_q4, V##_gemm_q8, V##_rms_norm_rows, V##_decoder_layers}

// Every variant this build holds, in order of preference (native.py picks the first the CPU runs).
const Kernels kVariants[] = {
#ifdef SD_HAS_amx
    SD_KERNELS(amx),
#endif
#ifdef SD_HAS_vnni
    SD_KERNELS(vnni),
#endif
#ifdef SD_HAS_avx512_vnni
    SD_KERNELS(avx512_vnni),
#endif
    SD_KERNELS(avx2),
#ifdef SD_HAS_portable
    SD_KERNELS(portable),
#endif
};
constexpr int64_t kVariantCount = sizeof(kVariants) / sizeof(kVariants[0]);

const Kernels &kernels(int64_t variant) {
  TORCH_CHECK(variant >= 0 && variant < kVariantCount, "no kernel variant ", variant, " in this build (",
              kVariantCount, " variants)");
  return kVariants[variant];
}

void check(const at::Tensor &t, const std::string &what, at::ScalarType dtype, at::IntArrayRef shape) {
  TORCH_CHECK(t.device().is_cpu(), what, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == dtype, what, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.sizes() == shape, what, " must have shape ", shape, ", got ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), what, " must be contiguous");
}

std::vector<std::string> variants() {
  std::vector<std::string> names;
  for (const auto &k : kVariants) names.emplace_back(k.name);
  return names;
}

constexpr int64_t kGroup = 8;  // output columns packed together (linear.py: GROUP)

// A packed layer's tensors checked against its shape: codes [n/8, k/32, 128 (q4) or 256 (q8)], d and m fp16
// [n/8, k/32, 8], bias float32 [n]; returns the layer as the kernels read it (pointers into the tensors).
qlinear_t packed_layer(const char *what, const at::Tensor &codes, const at::Tensor &d, const c10::optional<at::Tensor> &m,
                       const c10::optional<at::Tensor> &bias, int64_t n, int64_t k) {
  TORCH_CHECK(n % kGroup == 0 && k % SD_QK == 0, what, ": a ", k, " -> ", n, " layer does not fit the packed layout");
  const bool q4 = m.has_value();
  const std::string name(what);
  check(codes, name + " codes", q4 ? at::kByte : at::kChar, {n / kGroup, k / SD_QK, q4 ? 128 : 256});
  check(d, name + " d", at::kHalf, {n / kGroup, k / SD_QK, kGroup});
  if (q4) check(*m, name + " m", at::kHalf, {n / kGroup, k / SD_QK, kGroup});
  if (bias.has_value()) check(*bias, name + " bias", at::kFloat, {n});
  return qlinear_t{q4, n, k, codes.data_ptr(), reinterpret_cast<const uint16_t *>(d.data_ptr()),
                   q4 ? reinterpret_cast<const uint16_t *>(m->data_ptr()) : nullptr,
                   bias.has_value() ? bias->data_ptr<float>() : nullptr};
}

// x [rows, k] float32 -> codes [rows, k] int8, scales [rows, k/32], scaled code sums [rows, k/32].
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_activations(const at::Tensor &x, int64_t variant) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) % SD_QK == 0, "x must be [rows, k] with k a multiple of 32, got ", x.sizes());
  const at::Tensor source = x.to(at::kFloat).contiguous();
  const int64_t rows = x.size(0), k = x.size(1);
  at::Tensor codes = at::empty({rows, k}, x.options().dtype(at::kChar));
  at::Tensor scale = at::empty({rows, k / SD_QK}, x.options().dtype(at::kFloat));
  at::Tensor sums = at::empty({rows, k / SD_QK}, x.options().dtype(at::kFloat));
  kernels(variant).quantize_activations(source.data_ptr<float>(), rows, k, codes.data_ptr<int8_t>(),
                                        scale.data_ptr<float>(), sums.data_ptr<float>());
  return {codes, scale, sums};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_activations_meta(const at::Tensor &x, int64_t) {
  const auto options = x.options().dtype(at::kFloat);
  return {at::empty({x.size(0), x.size(1)}, x.options().dtype(at::kChar)),
          at::empty({x.size(0), x.size(1) / SD_QK}, options), at::empty({x.size(0), x.size(1) / SD_QK}, options)};
}

// x [rows, k] -> [rows, n] float32 through packed q4 (m given) or q8 weights, on `threads` threads (0: torch's).
at::Tensor packed_matmul(const at::Tensor &x, const at::Tensor &codes, const at::Tensor &d,
                         const c10::optional<at::Tensor> &m, int64_t threads, int64_t variant) {
  TORCH_CHECK(x.dim() == 2, "x must be [rows, k], got ", x.sizes());
  TORCH_CHECK(codes.dim() == 3, "codes must be [n/8, k/32, bytes], got ", codes.sizes());
  const int64_t rows = x.size(0), k = x.size(1), n = codes.size(0) * kGroup;
  const qlinear_t w = packed_layer("packed weights", codes, d, m, c10::nullopt, n, k);
  const Kernels &run = kernels(variant);
  auto [xq, xd, xs] = quantize_activations(x, variant);
  at::Tensor out = at::empty({rows, n}, x.options().dtype(at::kFloat));
  if (w.q4)
    run.gemm_q4(static_cast<const uint8_t *>(w.codes), w.d, w.m, n, k, xq.data_ptr<int8_t>(), xd.data_ptr<float>(),
                xs.data_ptr<float>(), rows, out.data_ptr<float>(), n, threads);
  else
    run.gemm_q8(static_cast<const int8_t *>(w.codes), w.d, n, k, xq.data_ptr<int8_t>(), xd.data_ptr<float>(), rows,
                out.data_ptr<float>(), n, threads);
  return out;
}

at::Tensor packed_matmul_meta(const at::Tensor &x, const at::Tensor &codes, const at::Tensor &,
                              const c10::optional<at::Tensor> &, int64_t, int64_t) {
  return at::empty({x.size(0), codes.size(0) * kGroup}, x.options().dtype(at::kFloat));
}

// x [rows, n] float32 -> its RMS norm times weight [n], as the decoder layers compute theirs.
at::Tensor rms_norm_rows(const at::Tensor &x, const at::Tensor &weight, double eps, int64_t variant) {
  TORCH_CHECK(x.dim() == 2, "x must be [rows, n], got ", x.sizes());
  check(x, "x", at::kFloat, x.sizes());
  check(weight, "weight", at::kFloat, {x.size(1)});
  at::Tensor out = at::empty_like(x);
  kernels(variant).rms_norm_rows(x.data_ptr<float>(), weight.data_ptr<float>(), static_cast<float>(eps), x.size(0),
                                 x.size(1), out.data_ptr<float>());
  return out;
}

at::Tensor rms_norm_rows_meta(const at::Tensor &x, const at::Tensor &, double, int64_t) { return at::empty_like(x); }

// The decoder layers of one packed model as layers.c runs them: built once from the model's tensors (checked
// here, held here), then one forward call a pass.
struct DecoderStack : torch::CustomClassHolder {
  int64_t variant, heads, kv_heads, head_dim, hidden, inter;
  bool kv_half, gelu;
  std::vector<decoder_layer_t> layers;
  std::vector<at::Tensor> held;  // every tensor a layer points into
  std::vector<at::Tensor> small;  // work buffers of passes of up to kSmallRows rows, made at the first one
  static constexpr int64_t kSmallRows = 64;

  DecoderStack(int64_t variant, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t hidden, int64_t inter,
               bool kv_half, bool gelu)
      : variant(variant), heads(heads), kv_heads(kv_heads), head_dim(head_dim), hidden(hidden), inter(inter),
        kv_half(kv_half), gelu(gelu) {
    kernels(variant);
    TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "heads ", heads, " must be a multiple of kv heads ",
                kv_heads);
    TORCH_CHECK(head_dim > 0 && head_dim % 2 == 0, "head_dim must be positive and even (rotary pairs), got ", head_dim);
  }

  // projections in the order q, k, v, o, gate, up, down: codes, d, m (q4 only) and bias of each; norms float32.
  void add_layer(std::vector<at::Tensor> codes, std::vector<at::Tensor> d, std::vector<c10::optional<at::Tensor>> m,
                 std::vector<c10::optional<at::Tensor>> bias, at::Tensor norm_in, at::Tensor norm_post,
                 c10::optional<at::Tensor> norm_attn_out, c10::optional<at::Tensor> norm_mlp_out,
                 c10::optional<at::Tensor> q_norm, c10::optional<at::Tensor> k_norm, double eps, double scale,
                 int64_t kind) {
    TORCH_CHECK(codes.size() == 7 && d.size() == 7 && m.size() == 7 && bias.size() == 7,
                "a layer has 7 projections (q, k, v, o, gate, up, down)");
    TORCH_CHECK(kind == 0 || kind == 1, "layer kind must be 0 (full attention) or 1 (sliding window), got ", kind);
    const char *names[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    const int64_t qd = heads * head_dim, kvd = kv_heads * head_dim;
    const int64_t n[7] = {qd, kvd, kvd, hidden, inter, inter, hidden};
    const int64_t k[7] = {hidden, hidden, hidden, qd, hidden, hidden, inter};
    qlinear_t p[7];
    for (int i = 0; i < 7; i++) {
      p[i] = packed_layer(names[i], codes[i], d[i], m[i], bias[i], n[i], k[i]);
      held.insert(held.end(), {codes[i], d[i]});
      if (m[i].has_value()) held.push_back(*m[i]);
      if (bias[i].has_value()) held.push_back(*bias[i]);
    }
    auto norm = [&](const c10::optional<at::Tensor> &w, const char *what, int64_t size) -> const float * {
      if (!w.has_value()) return nullptr;
      check(*w, what, at::kFloat, {size});
      held.push_back(*w);
      return w->data_ptr<float>();
    };
    decoder_layer_t layer{p[0], p[1], p[2], p[3], p[4], p[5], p[6],
                          norm(norm_in, "norm_in", hidden), norm(norm_post, "norm_post", hidden),
                          static_cast<float>(eps), heads, kv_heads, head_dim, hidden, inter, kv_half,
                          norm(q_norm, "q_norm", head_dim), norm(k_norm, "k_norm", head_dim),
                          norm(norm_attn_out, "norm_attn_out", hidden), norm(norm_mlp_out, "norm_mlp_out", hidden),
                          static_cast<float>(scale), gelu, kind};
    layers.push_back(layer);
  }

  // x [R, hidden] float32, updated in place by layers first <= l < count (a pass runs them all at once, or in
  // stretches where a drafter reads the states between: EAGLE-3). starts [batch + 1]: batch row b holds rows
  // starts[b] <= r < starts[b + 1]; cos, sin: per layer kind [R, head_dim]; pointers [>= count, 3, batch] int64
  // (the cache's row_pointers, from layer 0); slots [R]; visible: per layer kind [R, kv_len] uint8 (1 = visible).
  void forward(at::Tensor x, at::Tensor starts, std::vector<at::Tensor> cos, std::vector<at::Tensor> sin,
               at::Tensor pointers, at::Tensor slots, std::vector<at::Tensor> visible, int64_t first, int64_t count,
               int64_t threads) {
    TORCH_CHECK(count >= 1 && count <= static_cast<int64_t>(layers.size()), "count must be 1..", layers.size());
    TORCH_CHECK(first >= 0 && first < count, "first must be 0..count - 1, got ", first);
    TORCH_CHECK(x.dim() == 2, "x must be [rows, hidden], got ", x.sizes());
    const int64_t rows = x.size(0), batch = starts.size(0) - 1;
    check(x, "x", at::kFloat, {rows, hidden});
    check(starts, "starts", at::kLong, {batch + 1});
    const int64_t *start = starts.data_ptr<int64_t>();
    TORCH_CHECK(batch >= 1 && start[0] == 0 && start[batch] == rows, "starts must run from 0 to the rows");
    for (int64_t b = 0; b < batch; b++) TORCH_CHECK(start[b] <= start[b + 1], "starts must not decrease");
    check(slots, "slots", at::kLong, {rows});
    TORCH_CHECK(pointers.dim() == 3 && pointers.size(0) >= count, "pointers must hold at least ", count, " layers");
    check(pointers, "pointers", at::kLong, {pointers.size(0), 3, batch});
    TORCH_CHECK(cos.size() == 2 && sin.size() == 2 && visible.size() == 2, "cos, sin and visible: one per layer kind");
    TORCH_CHECK(visible[0].dim() == 2, "visible must be [rows, kv_len]");
    const int64_t kv_len = visible[0].size(1);
    const float *cos_at[2], *sin_at[2];
    const uint8_t *seen_at[2];
    for (int i = 0; i < 2; i++) {
      check(cos[i], "cos", at::kFloat, {rows, head_dim});
      check(sin[i], "sin", at::kFloat, {rows, head_dim});
      check(visible[i], "visible", at::kByte, {rows, kv_len});
      cos_at[i] = cos[i].data_ptr<float>(), sin_at[i] = sin[i].data_ptr<float>();
      seen_at[i] = visible[i].data_ptr<uint8_t>();
    }
    std::vector<const decoder_layer_t *> table;
    for (int64_t i = first; i < count; i++) table.push_back(&layers[i]);
    std::vector<at::Tensor> made;
    const std::vector<at::Tensor> &work = rows <= kSmallRows ? small_buffers() : (made = buffers(rows));
    const scratch_t scratch{work[0].data_ptr<int8_t>(), work[1].data_ptr<float>(), work[2].data_ptr<float>(),
                            work[3].data_ptr<float>(), work[4].data_ptr<float>(), work[5].data_ptr<float>(),
                            work[6].data_ptr<float>(), work[7].data_ptr<float>(), work[8].data_ptr<float>(),
                            work[9].data_ptr<float>(), work[10].data_ptr<float>()};
    void *const *at = reinterpret_cast<void *const *>(pointers.data_ptr<int64_t>() + 3 * first * batch);
    kernels(variant).decoder_layers(table.data(), count - first, x.data_ptr<float>(), rows, batch, start, cos_at,
                                    sin_at, at,
                                    slots.data_ptr<int64_t>(), seen_at, kv_len, &scratch, threads);
  }

  const std::vector<at::Tensor> &small_buffers() {
    if (small.empty()) small = buffers(kSmallRows);
    return small;
  }

  // scratch_t's buffers for `rows` rows, in its field order.
  std::vector<at::Tensor> buffers(int64_t rows) const {
    const int64_t qd = heads * head_dim, kvd = kv_heads * head_dim;
    const int64_t widest = std::max({hidden, inter, qd});
    const auto f = at::TensorOptions().dtype(at::kFloat);
    return {at::empty({rows, widest}, f.dtype(at::kChar)), at::empty({rows, widest / SD_QK}, f),
            at::empty({rows, widest / SD_QK}, f), at::empty({rows, hidden}, f), at::empty({rows, qd}, f),
            at::empty({rows, kvd}, f), at::empty({rows, kvd}, f), at::empty({rows, qd}, f),
            at::empty({rows, inter}, f), at::empty({rows, inter}, f), at::empty({rows, hidden}, f)};
  }

  int64_t size() const { return static_cast<int64_t>(layers.size()); }
};

}  // namespace

TORCH_LIBRARY(specdecode_native, m) {
  m.def("variants() -> str[]", &variants);
  m.def("quantize_activations(Tensor x, int variant) -> (Tensor, Tensor, Tensor)");
  m.def("packed_matmul(Tensor x, Tensor codes, Tensor d, Tensor? m, int threads, int variant) -> Tensor");
  m.def("rms_norm_rows(Tensor x, Tensor weight, float eps, int variant) -> Tensor");
  m.class_<DecoderStack>("DecoderStack")
      .def(torch::init<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>())
      .def("add_layer", &DecoderStack::add_layer)
      .def("forward", &DecoderStack::forward)
      .def("size", &DecoderStack::size);
}

TORCH_LIBRARY_IMPL(specdecode_native, CPU, m) {
  m.impl("quantize_activations", &quantize_activations);
  m.impl("packed_matmul", &packed_matmul);
  m.impl("rms_norm_rows", &rms_norm_rows);
}

TORCH_LIBRARY_IMPL(specdecode_native, Meta, m) {
  m.impl("quantize_activations", &quantize_activations_meta);
  m.impl("packed_matmul", &packed_matmul_meta);
  m.impl("rms_norm_rows", &rms_norm_rows_meta);
}

// Importing the module (native.py) is what registers the operators above.
extern "C" PyMODINIT_FUNC PyInit__native(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "specdecode's native kernels (torch operators)", -1,
                               nullptr};
  return PyModule_Create(&module);
}
