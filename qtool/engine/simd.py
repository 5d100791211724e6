"""The GEMM micro-kernel of the CPU engines, emitted as LLVM IR through a numba intrinsic.

`gemm_rows(a, w, out)` computes `out[m, c] = sum_k a[m, k] * W[c, k]` for the MB rows of `a`
and every output channel, with W packed by `pack` so that no horizontal sum is ever needed:
channels in blocks of L lanes, inputs in groups of g values, laid out
`[tile][k group][NB blocks][L lanes][g]`. One step of the inner loop broadcasts the g inputs of
one row (a dword) to every lane and multiplies them with NB weight vectors: MB x NB vector
accumulators stay in registers for the whole k loop (register blocking of the batch rows and the
channels; the weights are read once per MB rows).

The lane operation, by the operands' types:
- uint8 inputs x int8 weights, g = 4: `vpdpbusd` (AVX-512 VNNI), four products into each int32
  lane, no saturation. LLVM does not generate it from a loop, hence the intrinsic.
- int16 x int16, g = 2: `vpdpwssd` (VNNI), else `vpmaddwd` + add (AVX-512BW or AVX2), else
  generic IR: two products into each int32 lane, no saturation.
- float32 (the float reference), float64 and int64 (exact integer paths of last resort): g = 1,
  a fused multiply-add (float) or multiply and add (int64) per lane.
Every integer sum here is exact while the caller's static bound keeps it below 2^31 (int32
lanes); the engine checks that bound before it chooses an arithmetic (engine_cpu.gemm_plan).
"""

from __future__ import annotations

import llvmlite.binding as llb
import numpy as np
from llvmlite import ir
from numba import config, types
from numba.core import cgutils, cpu, options
from numba.extending import intrinsic, overload
from numba.np.numpy_support import from_dtype


def target_features() -> set[str]:
    """The x86 features numba compiles for: the host's, unless NUMBA_CPU_NAME names another
    CPU (then only the features NUMBA_CPU_FEATURES lists: a portable target)."""
    named = config.CPU_NAME not in (None, "host")
    if named and config.CPU_FEATURES is None:
        return set(_NAMED.get(config.CPU_NAME, ()))
    try:
        host = {k for k, v in llb.get_host_cpu_features().items() if v}
    except RuntimeError:
        host = set()
    if config.CPU_FEATURES is not None:
        listed = {f[1:] for f in config.CPU_FEATURES.split(",") if f.startswith("+")}
        return listed if named else host & listed
    return host


# CPUs one may name in NUMBA_CPU_NAME to measure a portable build (features LLVM gives them)
_NAMED = {"haswell": ("avx2", "fma"), "znver2": ("avx2", "fma"), "znver3": ("avx2", "fma"),
          "skylake-avx512": ("avx2", "fma", "avx512f", "avx512bw"),
          "icelake-server": ("avx2", "fma", "avx512f", "avx512bw", "avx512vnni"),
          "znver4": ("avx2", "fma", "avx512f", "avx512bw", "avx512vnni")}

# numba's compiler flag `noalias` (its parfor kernels set it), as an njit option: array arguments
# that never overlap. Without it LLVM cannot vectorise a loop that reads a table at computed
# indices while it stores elsewhere (it cannot bound the table's reads for a runtime check).
if not hasattr(cpu.CPUTargetOptions, "noalias"):
    cpu.CPUTargetOptions.noalias = options.TargetOptions.Mapping("noalias")

# LLVM inlines the integer cell (qtool.numerics.intops.gru_cell, ~300 instructions) into the loops over
# hidden units before it vectorises them; numba's own inlining would add reference counting
# of the cell's array arguments inside the loop, which stops the vectoriser.
llb.set_option("", "-inline-threshold=3000")
# the cell loops store a unit's 17 values into rows of one buffer: more runtime pointer checks
# than LLVM's default of 8 before it vectorises
for opt in ("-runtime-memory-check-threshold=512", "-vectorize-memory-check-threshold=512"):
    llb.set_option("", opt)

FEATURES = target_features()
HAS_VNNI = {"avx512vnni", "avx512bw"} <= FEATURES
HAS_AVX512 = {"avx512f", "avx512bw"} <= FEATURES

# The engine's SIMD paths, lowest first: the CPU numba compiles for to take one, and the vector
# extensions that path may use. A lower path runs on a CPU that has a higher one, so a test run
# can force each path its machine has (`path_env`) and prove every one of them exact.
_AVX2 = ("avx", "avx2", "fma", "f16c")
_AVX512 = (*_AVX2, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
PATHS = {"generic": ("generic", ()), "avx2": ("haswell", _AVX2),
         "avx512": ("skylake-avx512", _AVX512), "vnni": ("icelake-server", (*_AVX512, "avx512vnni"))}


def simd_path() -> str:
    """The path this process's engine takes (a key of PATHS)."""
    if HAS_VNNI:
        return "vnni"
    if HAS_AVX512:
        return "avx512"
    return "avx2" if {"avx2", "fma"} <= FEATURES else "generic"


def _vector_feature(name: str) -> bool:
    return name.startswith(("avx", "amx")) or name in ("fma", "fma4", "f16c", "xop", "vaes", "vpclmulqdq", "gfni")


def path_env(path: str) -> dict[str, str] | None:
    """The environment that makes a new process compile the engine for `path` on this CPU: the
    path's CPU name, and this CPU's features with every vector extension the path lacks turned
    off (so that LLVM emits none of it). None where this CPU lacks one the path needs."""
    cpu_name, keep = PATHS[path]
    if path == "generic":  # numba's portable target: the architecture's baseline (SSE2 on x86-64)
        return {"NUMBA_CPU_NAME": "generic", "NUMBA_CPU_FEATURES": ""}  # none inherited from a forced path
    try:
        host = dict(llb.get_host_cpu_features().items())
    except RuntimeError:
        return None
    if not all(host.get(f) for f in keep):
        return None
    flags = [("+" if on and (f in keep or not _vector_feature(f)) else "-") + f for f, on in host.items()]
    return {"NUMBA_CPU_NAME": cpu_name, "NUMBA_CPU_FEATURES": ",".join(flags)}
# rows x channel blocks per tile: MB * NB accumulators plus NB weights and a broadcast fit the
# 32 vector registers of AVX-512 (16 of AVX2, where a 16-lane vector takes two registers)
MB = 4
NB = 6 if HAS_AVX512 else 1

# kind -> (input dtype, weight dtype, sum dtype, g inputs per lane, L lanes)
KINDS = {
    "u8s8": (np.uint8, np.int8, np.int32, 4, 16),
    "s16": (np.int16, np.int16, np.int32, 2, 16),
    "f32": (np.float32, np.float32, np.float32, 1, 16),
    "f64": (np.float64, np.float64, np.float64, 1, 8),
    "i64": (np.int64, np.int64, np.int64, 1, 8),
}


def padded(n: int, kind: str) -> int:
    """Output channels rounded up to whole tiles of NB blocks of L lanes."""
    step = NB * KINDS[kind][4]
    return -(-n // step) * step


def pack(q_w: np.ndarray, kind: str) -> tuple[np.ndarray, int]:
    """W [C_out, K] -> (the packed weights, the padded input width Kp). Zero rows and columns
    pad C_out to `padded` and K to a multiple of g; their products are 0."""
    _, w_t, _, g, L = KINDS[kind]
    c_out, K = q_w.shape
    Kp = -(-K // g) * g
    w = np.zeros((padded(c_out, kind), Kp), w_t)
    w[:c_out, :K] = q_w
    tiles = w.shape[0] // (NB * L)
    # [tile, NB, L, KG, g] -> [tile, KG, NB, L, g]
    w = w.reshape(tiles, NB, L, Kp // g, g).transpose(0, 3, 1, 2, 4)
    return np.ascontiguousarray(w).reshape(-1), Kp


def _lane_op(builder, kind, acc, a, w):
    """acc + (the lane products of the broadcast inputs `a` and the weights `w`)."""
    mod = builder.module
    v16 = ir.VectorType(ir.IntType(32), 16)
    if kind == "u8s8":
        f = cgutils.get_or_insert_function(mod, ir.FunctionType(v16, [v16] * 3), "llvm.x86.avx512.vpdpbusd.512")
        return builder.call(f, [acc, a, w])
    if kind == "s16":
        if HAS_VNNI:
            f = cgutils.get_or_insert_function(mod, ir.FunctionType(v16, [v16] * 3), "llvm.x86.avx512.vpdpwssd.512")
            return builder.call(f, [acc, a, w])
        v32h = ir.VectorType(ir.IntType(16), 32)
        a16, w16 = builder.bitcast(a, v32h), builder.bitcast(w, v32h)
        if HAS_AVX512:
            f = cgutils.get_or_insert_function(mod, ir.FunctionType(v16, [v32h, v32h]), "llvm.x86.avx512.pmaddw.d.512")
            return builder.add(acc, builder.call(f, [a16, w16]))
        if "avx2" in FEATURES:
            v8, v16h = ir.VectorType(ir.IntType(32), 8), ir.VectorType(ir.IntType(16), 16)
            f = cgutils.get_or_insert_function(mod, ir.FunctionType(v8, [v16h, v16h]), "llvm.x86.avx2.pmadd.wd")
            halves = []
            for h in range(2):
                idx = ir.Constant(ir.VectorType(ir.IntType(32), 16), list(range(16 * h, 16 * h + 16)))
                halves.append(builder.call(f, [builder.shuffle_vector(a16, a16, idx),
                                               builder.shuffle_vector(w16, w16, idx)]))
            both = builder.shuffle_vector(halves[0], halves[1],
                                         ir.Constant(ir.VectorType(ir.IntType(32), 16), list(range(16))))
            return builder.add(acc, both)
        v32 = ir.VectorType(ir.IntType(32), 32)
        prod = builder.mul(builder.sext(a16, v32), builder.sext(w16, v32))
        even = ir.Constant(ir.VectorType(ir.IntType(32), 16), list(range(0, 32, 2)))
        odd = ir.Constant(ir.VectorType(ir.IntType(32), 16), list(range(1, 32, 2)))
        return builder.add(acc, builder.add(builder.shuffle_vector(prod, prod, even),
                                            builder.shuffle_vector(prod, prod, odd)))
    if kind == "i64":
        return builder.add(acc, builder.mul(a, w))
    fma = "llvm.fma.v16f32" if kind == "f32" else "llvm.fma.v8f64"
    f = cgutils.get_or_insert_function(mod, ir.FunctionType(acc.type, [acc.type] * 3), fma)
    return builder.call(f, [a, w, acc])


def _kind_of(a, w, out):
    for kind, (a_t, w_t, s_t, _, _) in KINDS.items():
        if (a.dtype, w.dtype, out.dtype) == tuple(from_dtype(np.dtype(t)) for t in (a_t, w_t, s_t)):
            return kind
    return None


@intrinsic
def gemm_rows(typingctx, a, w, out):
    """out[m, c] = sum_k a[m, k] W[c, k] for the MB rows m of `a` [MB, Kp] and all packed
    channels of `w` (see `pack`); `out` is [MB, padded channels]."""
    kind = _kind_of(a, w, out)
    if kind is None or a.ndim != 2 or w.ndim != 1 or out.ndim != 2:
        return None
    _, _, _, g, L = KINDS[kind]
    sig = types.void(a, w, out)

    def codegen(context, builder, signature, args):
        a_ty, w_ty, o_ty = signature.args
        A = context.make_array(a_ty)(context, builder, args[0])
        W = context.make_array(w_ty)(context, builder, args[1])
        O = context.make_array(o_ty)(context, builder, args[2])
        i64 = ir.IntType(64)
        a_el = context.get_data_type(a_ty.dtype)
        s_el = context.get_data_type(o_ty.dtype)
        lane = ir.VectorType(s_el, L)  # one accumulator / one weight vector
        grp = ir.IntType(a_el.width * g) if g > 1 else a_el  # g inputs read as one lane value
        Kp = builder.extract_value(A.shape, 1)
        width = builder.extract_value(O.shape, 1)
        KG = builder.udiv(Kp, ir.Constant(i64, g))
        tiles = builder.udiv(width, ir.Constant(i64, NB * L))
        a_row = [builder.gep(A.data, [builder.mul(ir.Constant(i64, m), Kp)]) for m in range(MB)]
        w_ptr = builder.bitcast(W.data, lane.as_pointer())
        accs = [[cgutils.alloca_once(builder, lane) for _ in range(NB)] for _ in range(MB)]
        zero = ir.Constant(lane, None)
        with cgutils.for_range(builder, tiles) as tile:
            for row in accs:
                for p in row:
                    builder.store(zero, p)
            base = builder.mul(tile.index, builder.mul(KG, ir.Constant(i64, NB)))
            with cgutils.for_range(builder, KG) as kg:
                blk = builder.add(base, builder.mul(kg.index, ir.Constant(i64, NB)))
                wv = [builder.load(builder.gep(w_ptr, [builder.add(blk, ir.Constant(i64, b))]), align=1)
                      for b in range(NB)]
                for m in range(MB):
                    src = builder.gep(a_row[m], [builder.mul(kg.index, ir.Constant(i64, g))])
                    val = builder.load(builder.bitcast(src, grp.as_pointer()), align=1)
                    if g > 1:
                        val = builder.bitcast(val, s_el)
                    bc = cgutils.get_null_value(lane)
                    bc = builder.insert_element(bc, val, ir.Constant(ir.IntType(32), 0))
                    bc = builder.shuffle_vector(bc, bc, ir.Constant(ir.VectorType(ir.IntType(32), L), [0] * L))
                    for b in range(NB):
                        builder.store(_lane_op(builder, kind, builder.load(accs[m][b]), bc, wv[b]), accs[m][b])
            col = builder.mul(tile.index, ir.Constant(i64, NB * L))
            for m in range(MB):
                orow = builder.gep(O.data, [builder.add(builder.mul(ir.Constant(i64, m), width), col)])
                optr = builder.bitcast(orow, lane.as_pointer())
                for b in range(NB):
                    builder.store(builder.load(accs[m][b]), builder.gep(optr, [ir.Constant(i64, b)]), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefer_wide_vectors(typingctx):
    """Lets LLVM vectorise the calling function's loops over whole AVX-512 registers: for CPUs
    it tunes to 256-bit vectors (Intel's since Skylake-SP, which lower their clock on 512-bit
    work) it would otherwise give the integer cell 4 int64 or 8 int32 lanes, not 8 or 16.
    On AVX2-only CPUs, lets it use gathers (the cell's table lookups). Function attributes,
    so nothing else numba compiles changes."""

    def codegen(context, builder, signature, args):
        # llvmlite's attribute set checks names against a fixed list; these are key="value"
        # attributes, which LLVM's IR parser reads as written
        if HAS_AVX512:
            set.add(builder.function.attributes, '"prefer-vector-width"="512"')
        elif "avx2" in FEATURES and getattr(context.codegen(), "_tm_features", None):
            # LLVM scalarises AVX2 gathers on CPUs it does not tune as "fast-gather" (Haswell,
            # Zen 1-3), and with them the whole cell loop: 3x slower than with gathers. The
            # attribute replaces the target's features for this function: all of them, plus it.
            features = context.codegen()._tm_features + ",+fast-gather"
            set.add(builder.function.attributes, f'"target-features"="{features}"')
        return context.get_dummy_value()

    return types.void(), codegen


def f32_from_bits(i):
    """The float32 whose bit pattern is the int32 `i` (to build 2^n in a vectorisable exp).
    Plain Python here (numba's CUDA simulator runs it); compiled code uses the bitcast below."""
    return np.array(i, np.int32).view(np.float32)[()]


def _bitcast(src, dst, to_ir, target: str = "cpu"):
    """An intrinsic that reads the bits of a `src` scalar as a `dst` (LLVM type `to_ir`)."""

    def bitcast(typingctx, x):
        if x != src:
            return None

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], to_ir)

        return dst(x), codegen

    return intrinsic(target=target)(bitcast)


_bitcast_f32 = _bitcast(types.int32, types.float32, ir.FloatType(), "generic")


@overload(f32_from_bits, target="generic", inline="always")
def _f32_from_bits(i):
    return lambda i: _bitcast_f32(i)


# f64_bits(x): the int64 bit pattern of the float64 x; for x >= 0 it orders as x does, so a
# maximum of non-negative floats becomes an integer maximum, which LLVM vectorises as a reduction.
f64_bits = _bitcast(types.float64, types.int64, ir.IntType(64))
# f64_from_bits(i): the float64 whose bit pattern is the int64 i (the inverse of f64_bits).
f64_from_bits = _bitcast(types.int64, types.float64, ir.DoubleType())
