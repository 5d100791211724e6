"""The int8 dot product on the CPU's VNNI instruction, for the numba engine.

`vpdpbusd` multiplies 64 uint8 by 64 int8 values and adds each group of four products into one
of 16 int32 sums, with no saturation: an exact integer dot product while the sum of |products|
stays below 2^31. LLVM does not generate it from a plain loop, so `dot_u8s8` emits it directly.
It is used only where the host CPU has AVX-512 VNNI (`HAS_VNNI`); elsewhere the engine keeps
its portable loops. Its signed inputs are read as uint8 `q + 128`, a view whose zero point is
`zp + 128` (see engine_cpu.gemm_operands).
"""

from __future__ import annotations

import llvmlite.binding as llb
from llvmlite import ir
from numba import config, types
from numba.core import cgutils
from numba.extending import intrinsic

BLOCK = 64  # bytes per vpdpbusd operand: rows are zero-padded to a multiple


def _host_has_vnni() -> bool:
    if config.CPU_NAME not in (None, "host"):  # a generic target for portable caches
        return False
    if config.CPU_FEATURES is not None and "+avx512vnni" not in config.CPU_FEATURES:
        return False
    try:
        return bool(llb.get_host_cpu_features().get("avx512vnni"))
    except RuntimeError:
        return False


HAS_VNNI = _host_has_vnni()


@intrinsic
def dot_u8s8(typingctx, a, m, w, c):
    """sum_k a[m, k] * w[c, k] as int32, for uint8 `a` and int8 `w` whose rows have the same
    length, a multiple of BLOCK."""
    if not (a.dtype == types.uint8 and w.dtype == types.int8 and a.ndim == w.ndim == 2
            and a.layout == w.layout == "C"):
        return None
    sig = types.int32(a, m, w, c)

    def codegen(context, builder, signature, args):
        a_ty, _, w_ty, _ = signature.args
        a_val, m_val, w_val, c_val = args
        A = context.make_array(a_ty)(context, builder, a_val)
        W = context.make_array(w_ty)(context, builder, w_val)
        K = builder.extract_value(A.shape, 1)
        byte_ptr = ir.IntType(8).as_pointer()
        row_a = builder.gep(builder.bitcast(A.data, byte_ptr), [builder.mul(m_val, K)])
        row_w = builder.gep(builder.bitcast(W.data, byte_ptr), [builder.mul(c_val, K)])
        v16 = ir.VectorType(ir.IntType(32), 16)
        dpbusd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v16] * 3),
                                                "llvm.x86.avx512.vpdpbusd.512")
        acc = cgutils.alloca_once_value(builder, ir.Constant(v16, None))
        with cgutils.for_range(builder, builder.udiv(K, ir.Constant(K.type, BLOCK))) as loop:
            off = builder.mul(loop.index, ir.Constant(K.type, BLOCK))
            va = builder.load(builder.bitcast(builder.gep(row_a, [off]), v16.as_pointer()), align=1)
            vw = builder.load(builder.bitcast(builder.gep(row_w, [off]), v16.as_pointer()), align=1)
            builder.store(builder.call(dpbusd, [builder.load(acc), va, vw]), acc)
        reduce_add = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(32), [v16]), "llvm.vector.reduce.add.v16i32")
        return builder.call(reduce_add, [builder.load(acc)])

    return sig, codegen
