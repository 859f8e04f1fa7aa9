"""The Triton kernels of lower/matmul.py, in a module of their own so that Triton is imported
only where one is launched (matmul.py imports this module then). Two kernels compute
c = a @ b into a contiguous c of M x N: one reads the operands through pointers and strides,
one through tensor descriptors (the Hopper GPU's TMA unit copies whole blocks into shared
memory). They share the order of their tiles and their store."""
import triton
import triton.language as tl


@triton.jit
def _tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's tile of c: programs in groups of GROUP_M rows of tiles, column by column,
    so that the columns of b a group reads stay in L2."""
    pid = tl.program_id(0)
    blocks_m, blocks_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * blocks_n)
    first_m = group * GROUP_M
    group_m = min(blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * blocks_n)) % group_m
    pid_n = (pid % (GROUP_M * blocks_n)) // group_m
    return pid_m, pid_n


@triton.jit
def _dot(a, b, acc, TF32: tl.constexpr):
    if TF32:
        return tl.dot(a, b, acc, input_precision="tf32")
    return tl.dot(a, b, acc)


@triton.jit
def _store(c_ptr, acc, pid_m, pid_n, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The tile into c's rows of N elements, which need no alignment: rows and columns past
    the edges are not stored."""
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, TF32: tl.constexpr):
    pid_m, pid_n = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # rows and columns past the edge read row/column 0 again (no mask on the loads); their
    # results are not stored
    am = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
    bn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + am[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < left, other=0.0)
        acc = _dot(a, b, acc, TF32)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    _store(c_ptr, acc, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)


@triton.jit
def mm_descriptor_kernel(a_desc, b_desc, c_ptr, M, N, K,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, TF32: tl.constexpr):
    pid_m, pid_n = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # blocks past the operands' edges are read as zeros
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        b = b_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
        acc = _dot(a, b.T, acc, TF32)
    _store(c_ptr, acc, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)
