"""Generate a large, realistic, self-consistent CUDA allocator snapshot pickle for benchmarks.

Contract: ``python benchmarks/generate.py --events N [--segments K] -o PATH [--seed S] [--force]`` writes one pickle
(protocol 4, builtins only) shaped like what ``torch.cuda.memory._snapshot()`` returns on torch 2.11 for an
eager vLLM-style LLM serving run on one GPU: ``segments``, ``device_traces`` (one trace, device 0, exactly
N entries), ``allocator_settings`` and ``external_annotations``.  ``--segments K`` makes the segment-heavy
shape of the same run: before the window, K small tensors are each allocated in a fresh 2 MiB segment and
kept (a long run that never called ``empty_cache()``), so the end state holds K more segments (a pinned
block and the cached rest, which the window's small tensors then use).  The output is a pure function of
(N, K, seed): the same arguments give byte-identical files.  An existing PATH is never overwritten unless
``--force`` is given, and the file appears atomically (written to a temporary name, then renamed).

How it is made: a small model of the CUDA caching allocator (2 MiB small-pool segments for requests
<= 1 MiB, 20 MiB segments for < 10 MiB, otherwise the request rounded up to 2 MiB; best fit by size,
splitting and coalescing blocks; cached segments released when the device is full or on an explicit
``empty_cache()``) is driven by a tensor-level model of a Llama-8B-class decoder serving prefill and decode
steps.  Every allocator action while recording becomes a trace entry, so the end state in ``segments`` is
consistent with the trace by construction: replaying the trace reproduces the active blocks.  Weights, the
KV cache and a few profile-run leftovers are allocated *before* the recorded window (no ``alloc`` in the
trace, ``frames: []`` on their blocks); some leftovers are freed inside the window.  The window ends in the
middle of a step, so that step's activations are still live.

Frames mimic ``stacks="all"``: C++ frames (``??``, ``''`` or ``X.cpp``, line 0) interleaved with Python
frames, innermost first, about 30-70 deep.  As in torch's pickles, frame dicts are shared objects (one per
distinct frame), stacks are tuples of them, each event gets a new list referencing the shared dicts, and the
``free_requested``/``free_completed`` pair of one block share one list (as do a ``segment_alloc`` and the
``alloc`` that caused it, and an active block and its ``alloc``).

``benchmarks/check_generated.py`` verifies a generated file.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import sys
import time
from bisect import bisect_left, insort
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures"))
from support import round_size, segment_bytes  # noqa: E402

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

Frame = dict[str, Any]
Stack = tuple[Frame, ...]
Entry = dict[str, Any]

# ---------------------------------------------------------------------------------------------------------
# Model shape (Llama-3-8B-like, bf16) and the device.
HIDDEN = 4096
INTERMEDIATE = 14336
KV_DIM = 1024  # 8 kv heads x 128
N_HEADS = 32
VOCAB = 128256
N_LAYERS = 32
MAX_NUM_SEQS = 256
MAX_BLOCKS_PER_SEQ = 512
N_MISC_SITES = 400  # rarely hit allocation sites in the long tail
BF16 = 2
DEVICE_CAPACITY = 140 * GiB  # what cudaMalloc may hand out on an H200 before it fails
KV_CACHE_PER_LAYER = 3 * GiB + 512 * MiB  # sized, vLLM style, to leave a few GiB of headroom

BASE_ADDRESS = 0x7F2A_0000_0000  # where the (fake) device virtual addresses start; < 2**48
ADDR_BITS = 48  # free-list keys pack (size << 48) | address
START_TIME_US = 1_783_874_588_218_846

ALLOCATOR_SETTINGS: dict[str, Any] = {
    "PYTORCH_CUDA_ALLOC_CONF": "",
    "max_split_size": -1,
    "garbage_collection_threshold": 0.0,
    "expandable_segments": False,
    "pinned_num_register_threads": 1,
    "release_lock_on_cudamalloc": False,
    "pinned_use_cuda_host_register": False,
    "graph_capture_record_stream_reuse": False,
    "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)},
}


class _WindowFull(Exception):
    """Raised by the recorder when the trace has reached its target length."""


# ---------------------------------------------------------------------------------------------------------
# Frames and stacks.


class FramePool:
    """Interns frame dicts: one shared dict object per distinct (name, filename, line)."""

    def __init__(self) -> None:
        self._frames: dict[tuple[str, str, int], Frame] = {}

    def __len__(self) -> int:
        return len(self._frames)

    def get(self, name: str, filename: str = "??", line: int = 0) -> Frame:
        key = (name, filename, line)
        frame = self._frames.get(key)
        if frame is None:
            frame = {"name": name, "filename": filename, "line": line}
            self._frames[key] = frame
        return frame

    def many(self, specs: Sequence[tuple[str, str] | tuple[str, str, int]]) -> list[Frame]:
        return [self.get(*spec) for spec in specs]


DIST = "/usr/local/lib/python3.12/dist-packages"
VLLM = f"{DIST}/vllm"
MODULE_PY = f"{DIST}/torch/nn/modules/module.py"
CONTEXTLIB_PY = f"{DIST}/torch/utils/_contextlib.py"
OPS_PY = f"{DIST}/torch/_ops.py"
USER_MODEL = "/workspace/acme-llm/acme_llm/modeling_acme.py"
USER_SCRIPT = "/workspace/acme-llm/scripts/bench_offline.py"
RUNNER = f"{VLLM}/v1/worker/gpu_model_runner.py"
SAMPLER = f"{VLLM}/v1/sample/sampler.py"
TOPKTOPP = f"{VLLM}/v1/sample/ops/topk_topp_sampler.py"
FA_BACKEND = f"{VLLM}/v1/attention/backends/flash_attn.py"

EVAL = ("_PyEval_EvalFrameDefault", "??")

ALLOC_PREFIX: list[tuple[str, str]] = [
    ("torch::unwind::unwind()", "??"),
    ("torch::CapturedTraceback::gather(bool, bool, bool)", "??"),
    ("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp"),
    (
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, "
        "CUstream_st*)",
        "CUDACachingAllocator.cpp",
    ),
    (
        "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, "
        "unsigned long, CUstream_st*)",
        "",
    ),
    ("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)", ""),
]

FREE_PREFIX: list[tuple[str, str]] = [
    ("torch::unwind::unwind()", "??"),
    ("torch::CapturedTraceback::gather(bool, bool, bool)", "??"),
    ("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp"),
    (
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free(c10::cuda::"
        "CUDACachingAllocator"
        "::Native::(anonymous namespace)::Block*)",
        "CUDACachingAllocator.cpp",
    ),
    ("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::free(void*)", ""),
    (
        "c10::intrusive_ptr<c10::StorageImpl, "
        "c10::detail::intrusive_target_default_null_type<c10::StorageImpl>"
        " >::reset_not_null_(c10::StorageImpl*)",
        "",
    ),
    ("c10::TensorImpl::~TensorImpl() [clone .localalias]", "TensorImpl.cpp"),
]
FREE_FROM_PYTHON: list[tuple[str, str]] = [
    ("THPVariable_clear(THPVariable*)", "python_variable.cpp"),
    ("THPVariable_dealloc(_object*)", "python_variable.cpp"),
    ("PyType_FromModuleAndSpec", "??"),
    ("_PyErr_ChainStackItem", "??"),
]
FREE_FROM_CPP: list[tuple[str, str]] = [
    ("at::Tensor::~Tensor()", "??"),
    ("std::vector<at::Tensor, std::allocator<at::Tensor> >::~vector()", "??"),
]

EMPTY_CUDA = [
    (
        "at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, "
        "c10::ScalarType, "
        "std::optional<c10::MemoryFormat>)",
        "??",
    ),
    (
        "at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, std::optional<c10::Device>, "
        "std::optional<c10::MemoryFormat>)",
        "??",
    ),
    (
        "at::detail::empty_cuda(c10::ArrayRef<long>, std::optional<c10::ScalarType>, "
        "std::optional<c10::Layout>, "
        "std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)",
        "??",
    ),
]
EMPTY_STRIDED_CUDA = [
    (
        "at::detail::empty_strided_generic(c10::ArrayRef<long>, c10::ArrayRef<long>, c10::Allocator*, "
        "c10::DispatchKeySet, c10::ScalarType)",
        "??",
    ),
    (
        "at::detail::empty_strided_cuda(c10::ArrayRef<long>, c10::ArrayRef<long>, c10::ScalarType, "
        "std::optional<c10::Device>)",
        "??",
    ),
    (
        "at::detail::empty_strided_cuda(c10::ArrayRef<long>, c10::ArrayRef<long>, "
        "std::optional<c10::ScalarType>, "
        "std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>)",
        "??",
    ),
]
ARGS = "(at::Tensor const&, at::Tensor const&)"


def _dispatch(op: str, schema: str, register: str = "RegisterCUDA_0.cpp") -> list[tuple[str, str]]:
    """The generic dispatcher frames of one ATen operator, innermost first."""
    return [
        (f"at::(anonymous namespace)::wrapper_CUDA_{op}{schema}", register),
        (
            "c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::WrapFunctionIntoFunctor_<"
            f"c10::CompileTimeFunctionPointer<at::Tensor {schema}, "
            f"&at::(anonymous namespace)::wrapper_CUDA_{op}>, "
            f"at::Tensor, c10::guts::typelist::typelist<{schema[1:-1]}> >, at::Tensor {schema}>::call("
            f"c10::OperatorKernel*, c10::DispatchKeySet, {schema[1:-1]})",
            register,
        ),
        (f"at::_ops::{op}::call{schema}", "??"),
    ]


def _structured(op: str, schema: str) -> list[tuple[str, str]]:
    """Frames of a structured kernel allocating its output through TensorIterator or create_out."""
    return [
        *EMPTY_CUDA,
        (
            "at::(anonymous namespace)::create_out(c10::ArrayRef<long>, c10::ArrayRef<long>, "
            "c10::TensorOptions const&)",
            "RegisterCUDA_0.cpp",
        ),
        (
            f"at::(anonymous namespace)::structured_{op}_out_functional::set_output_raw_strided(long, "
            "c10::ArrayRef<long>, c10::ArrayRef<long>, c10::TensorOptions, c10::ArrayRef<at::Dimname>)",
            "RegisterCUDA_0.cpp",
        ),
        (f"at::meta::structured_{op}::meta{schema}", "??"),
        *_dispatch(op, schema),
    ]


# C++ frames between the allocator and the Python binding, per kind of allocation, innermost first.
CPP_CHAINS: dict[str, list[tuple[str, str]]] = {
    "empty": [
        *EMPTY_CUDA,
        (
            "at::native::empty_cuda(c10::ArrayRef<long>, std::optional<c10::ScalarType>, "
            "std::optional<c10::Layout>,"
            " std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)",
            "??",
        ),
        *_dispatch(
            "memory_format_empty",
            "(c10::ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, "
            "std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)",
        ),
        ("torch::autograd::THPVariable_empty(_object*, _object*, _object*)", "python_torch_functions_0.cpp"),
    ],
    "empty_like": [
        *EMPTY_CUDA,
        (
            "at::native::empty_like(at::Tensor const&, std::optional<c10::ScalarType>, "
            "std::optional<c10::Layout>, "
            "std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)",
            "??",
        ),
        (
            "at::(anonymous namespace)::(anonymous namespace)::wrapper_CompositeExplicitAutograd__empty_like("
            "at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, "
            "std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)",
            "RegisterCompositeExplicitAutograd_0.cpp",
        ),
        (
            "at::_ops::empty_like::call(at::Tensor const&, std::optional<c10::ScalarType>, "
            "std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, "
            "std::optional<c10::MemoryFormat>)",
            "??",
        ),
        (
            "torch::autograd::THPVariable_empty_like(_object*, _object*, _object*)",
            "python_torch_functions_1.cpp",
        ),
    ],
    "mm": [
        *_structured("mm", ARGS),
        ("at::native::_matmul_impl(at::Tensor&, at::Tensor const&, at::Tensor const&)", "??"),
        ("at::native::matmul(at::Tensor const&, at::Tensor const&)", "??"),
        ("at::native::linear(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&)", "??"),
        (
            "at::_ops::linear::call(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&)",
            "??",
        ),
        ("torch::autograd::THPVariable_linear(_object*, _object*, _object*)", "python_nn_functions.cpp"),
    ],
    "addmm": [
        *_structured(
            "addmm",
            "(at::Tensor const&, at::Tensor const&, at::Tensor const&, c10::Scalar const&, "
            "c10::Scalar const&)",
        ),
        ("at::native::linear(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&)", "??"),
        (
            "at::_ops::linear::call(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&)",
            "??",
        ),
        ("torch::autograd::THPVariable_linear(_object*, _object*, _object*)", "python_nn_functions.cpp"),
    ],
    "index": [
        *EMPTY_CUDA,
        (
            "at::(anonymous namespace)::create_out(c10::ArrayRef<long>, c10::ArrayRef<long>, "
            "c10::TensorOptions const&)",
            "RegisterCUDA_0.cpp",
        ),
        (
            "at::(anonymous namespace)::structured_index_out_functional::set_output_raw_strided(long, "
            "c10::ArrayRef<long>, c10::ArrayRef<long>, c10::TensorOptions, c10::ArrayRef<at::Dimname>)",
            "RegisterCUDA_0.cpp",
        ),
        ("at::TensorIteratorBase::allocate_or_resize_outputs()", "??"),
        ("at::TensorIteratorBase::build(at::TensorIteratorConfig&)", "??"),
        (
            "at::meta::structured_index_Tensor::meta(at::Tensor const&, "
            "c10::IListRef<at::OptionalTensorRef>)",
            "??",
        ),
        *_dispatch("index_Tensor", "(at::Tensor const&, c10::List<std::optional<at::Tensor> > const&)"),
        (
            "at::indexing::dispatch_index(at::Tensor const&, std::vector<at::Tensor, "
            "std::allocator<at::Tensor> >&&)",
            "",
        ),
        ("torch::autograd::THPVariable_getitem(_object*, _object*)", ""),
    ],
    "embedding": [
        *_structured("index_select", "(at::Tensor const&, long, at::Tensor const&)"),
        ("at::native::embedding_symint(at::Tensor const&, at::Tensor const&, c10::SymInt, bool, bool)", "??"),
        ("at::_ops::embedding::call(at::Tensor const&, at::Tensor const&, c10::SymInt, bool, bool)", "??"),
        (
            "torch::autograd::THPVariable_embedding(_object*, _object*, _object*)",
            "python_torch_functions_1.cpp",
        ),
    ],
    "to_copy": [
        *EMPTY_STRIDED_CUDA,
        (
            "at::native::empty_strided_cuda(c10::ArrayRef<long>, c10::ArrayRef<long>, "
            "std::optional<c10::ScalarType>,"
            " std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>)",
            "??",
        ),
        (
            "at::_ops::empty_strided::redispatch(c10::DispatchKeySet, c10::ArrayRef<c10::SymInt>, "
            "c10::ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, "
            "std::optional<c10::Device>, std::optional<bool>)",
            "??",
        ),
        (
            "at::native::_to_copy(at::Tensor const&, std::optional<c10::ScalarType>, "
            "std::optional<c10::Layout>, "
            "std::optional<c10::Device>, std::optional<bool>, bool, std::optional<c10::MemoryFormat>)",
            "??",
        ),
        (
            "at::_ops::_to_copy::call(at::Tensor const&, std::optional<c10::ScalarType>, "
            "std::optional<c10::Layout>,"
            " std::optional<c10::Device>, std::optional<bool>, bool, std::optional<c10::MemoryFormat>)",
            "??",
        ),
        (
            "at::native::to(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, "
            "std::optional<c10::Device>, std::optional<bool>, bool, bool, std::optional<c10::MemoryFormat>)",
            "??",
        ),
        ("torch::autograd::THPVariable_to(_object*, _object*, _object*)", "python_variable_methods.cpp"),
    ],
    "softmax": [
        *_structured("_softmax_cuda", "(at::Tensor const&, long, bool)"),
        ("at::native::softmax(at::Tensor const&, long, std::optional<c10::ScalarType>)", "??"),
        ("at::_ops::softmax_int::call(at::Tensor const&, long, std::optional<c10::ScalarType>)", "??"),
        ("torch::autograd::THPVariable_softmax(_object*, _object*, _object*)", "python_variable_methods.cpp"),
    ],
    "log_softmax": [
        *_structured("_log_softmax_cuda", "(at::Tensor const&, long, bool)"),
        ("at::native::log_softmax(at::Tensor const&, long, std::optional<c10::ScalarType>)", "??"),
        ("at::_ops::log_softmax_int::call(at::Tensor const&, long, std::optional<c10::ScalarType>)", "??"),
        (
            "torch::autograd::THPVariable_log_softmax(_object*, _object*, _object*)",
            "python_variable_methods.cpp",
        ),
    ],
    "sort": [
        *_structured("sort_stable", "(at::Tensor const&, std::optional<bool>, long, bool)"),
        ("at::native::sort(at::Tensor const&, long, bool)", "??"),
        ("at::_ops::sort::call(at::Tensor const&, long, bool)", "??"),
        ("torch::autograd::THPVariable_sort(_object*, _object*, _object*)", "python_variable_methods.cpp"),
    ],
    "binary": [
        *_structured("div_Tensor", ARGS),
        (
            "at::TensorIteratorBase::build_borrowing_binary_op(at::TensorBase const&, at::TensorBase const&, "
            "at::TensorBase const&)",
            "??",
        ),
        ("torch::autograd::THPVariable_div(_object*, _object*, _object*)", "python_variable_methods.cpp"),
        ("PyNumber_TrueDivide", "??"),
    ],
    "argmax": [
        *_structured("argmax", "(at::Tensor const&, std::optional<long>, bool)"),
        ("torch::autograd::THPVariable_argmax(_object*, _object*, _object*)", "python_variable_methods.cpp"),
    ],
    "scatter": [
        *EMPTY_CUDA,
        (
            "at::native::zeros_symint(c10::ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>, "
            "std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>)",
            "??",
        ),
        (
            "at::_ops::zeros::call(c10::ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>, "
            "std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>)",
            "??",
        ),
        ("torch::autograd::THPVariable_zeros(_object*, _object*, _object*)", "python_torch_functions_2.cpp"),
    ],
    "cat": [
        *_structured("cat", "(c10::IListRef<at::Tensor> const&, long)"),
        ("torch::autograd::THPVariable_cat(_object*, _object*, _object*)", "python_torch_functions_0.cpp"),
    ],
    "flash_attn": [
        *EMPTY_CUDA,
        *_dispatch(
            "empty_memory_format",
            "(c10::ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, "
            "std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)",
        ),
        ("at::empty(c10::ArrayRef<long>, c10::TensorOptions, std::optional<c10::MemoryFormat>)", "??"),
        (
            "mha_varlen_fwd(at::Tensor&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor>&, "
            "at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, "
            "std::optional<at::Tensor>&, "
            "int, int, float, float, bool, bool, int, int, float, bool, std::optional<at::Generator>)",
            "flash_api.cpp",
        ),
        (
            "c10::impl::make_boxed_from_unboxed_functor<...mha_varlen_fwd...>::call(c10::OperatorKernel*, "
            "c10::OperatorHandle const&, c10::DispatchKeySet, std::vector<c10::IValue, "
            "std::allocator<c10::IValue> >*)",
            "make_boxed_from_unboxed_functor.h",
        ),
        (
            "torch::jit::invokeOperatorFromPython(std::vector<std::shared_ptr<torch::jit::Operator>, "
            "std::allocator<std::shared_ptr<torch::jit::Operator> > > const&, pybind11::args, "
            "pybind11::kwargs const&, "
            "std::optional<c10::DispatchKey>)",
            "pybind_utils.cpp",
        ),
        ("torch::jit::_get_operation_for_overload_or_packet(...)", "pybind_utils.cpp"),
        ("pybind11::cpp_function::dispatcher(_object*, _object*, _object*)", "??"),
    ],
    "workspace": [
        (
            "at::cuda::getCurrentCUDABlasHandle()::{lambda()#1}::operator()() const [clone .isra.0]",
            "CublasHandlePool.cpp",
        ),
        ("at::cuda::getCUDABlasLtWorkspace()", "CublasHandlePool.cpp"),
        (
            "void at::cuda::blas::gemm_internal<c10::BFloat16>(char, char, long, long, long, "
            "at::opmath_type<c10::BFloat16>, c10::BFloat16 const*, long, c10::BFloat16 const*, long, "
            "at::opmath_type<c10::BFloat16>, c10::BFloat16*, long)",
            "CUDABlas.cpp",
        ),
        (
            "at::native::(anonymous namespace)::addmm_out_cuda_impl(at::Tensor&, at::Tensor const&, "
            "at::Tensor const&,"
            " at::Tensor const&, c10::Scalar const&, c10::Scalar const&, "
            "at::native::(anonymous namespace)::Activation)",
            "Blas.cpp",
        ),
        *_dispatch("mm", ARGS),
        ("at::native::linear(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&)", "??"),
        ("torch::autograd::THPVariable_linear(_object*, _object*, _object*)", "python_nn_functions.cpp"),
    ],
}

# Host-to-device copies of the step's inputs in ``_prepare_inputs``.
PREP_SITES = (
    "prep_input_ids",
    "prep_positions",
    "prep_slot_mapping",
    "prep_seq_lens",
    "prep_block_table",
    "prep_query_start_loc",
    "prep_logits_indices",
)

# Extra ATen operators for the long tail of rarely-hit allocation sites.
MISC_OPS = (
    "add_Tensor mul_Tensor sub_Tensor where_self masked_fill_Scalar gather scatter_add cumsum topk clamp "
    "exp log neg eq_Scalar lt_Tensor bitwise_and_Tensor logical_not repeat_interleave_Tensor nonzero "
    "unique_dim arange_start_step full ones_like zeros_like index_put index_add bmm baddbmm amax "
    "sum_dim_IntList mean_dim pow_Tensor_Scalar rsqrt sigmoid gelu silu tril triu flip roll cat stack "
    "narrow_copy"
).split()
MISC_MODULES = [
    ("v1/structured_output/backend_xgrammar.py", ["fill_bitmask", "allocate_token_bitmask"]),
    ("v1/structured_output/__init__.py", ["grammar_bitmask", "_async_submit_fill_bitmask"]),
    ("v1/spec_decode/eagle.py", ["propose", "prepare_inputs", "load_model"]),
    ("v1/spec_decode/ngram_proposer.py", ["propose"]),
    ("v1/sample/rejection_sampler.py", ["forward", "rejection_sample", "generate_uniform_probs"]),
    ("v1/sample/logits_processor/builtin.py", ["apply", "update_state"]),
    ("v1/sample/ops/bad_words.py", ["apply_bad_words", "_apply_bad_words_single_batch"]),
    ("v1/sample/ops/logprobs.py", ["batched_count_greater_than"]),
    ("v1/sample/metadata.py", ["__init__"]),
    ("v1/worker/gpu_input_batch.py", ["_make_sampling_metadata", "_make_prompt_token_ids_tensor", "refresh"]),
    ("v1/worker/block_table.py", ["commit_block_table", "compute_slot_mapping", "append_row"]),
    (
        "v1/attention/backends/utils.py",
        ["make_local_attention_virtual_batches", "split_decodes_and_prefills"],
    ),
    (
        "v1/attention/backends/flash_attn.py",
        ["build", "_get_sliding_window_configs", "use_cascade_attention"],
    ),
    (
        "model_executor/layers/rotary_embedding.py",
        ["_compute_cos_sin_cache", "forward_cuda", "_compute_inv_freq"],
    ),
    ("model_executor/layers/logits_processor.py", ["_gather_logits", "_apply_logits_processors"]),
    ("model_executor/layers/utils.py", ["apply_penalties", "get_token_bin_counts_and_mask"]),
    ("model_executor/layers/lora/layers.py", ["apply", "set_mapping"]),
    ("lora/punica_wrapper/punica_gpu.py", ["add_lora_linear", "add_shrink", "add_expand"]),
    ("distributed/device_communicators/cuda_communicator.py", ["all_reduce", "all_gather"]),
    ("v1/metrics/stats.py", ["update_from_output"]),
    ("multimodal/inputs.py", ["as_kwargs", "_try_stack"]),
]


class StackLibrary:
    """Builds the shared stacks (tuples of shared frame dicts) that events reference."""

    def __init__(self) -> None:
        self.pool = FramePool()
        self._alloc: dict[tuple[str, int], Stack] = {}
        self._free: dict[tuple[str, int], Stack] = {}

    # -- building blocks -----------------------------------------------------------------------------------
    def _module_call(self) -> list[Frame]:
        """``nn.Module.__call__`` as it appears between a caller's frame and the callee's ``forward``."""
        return self.pool.many(
            [
                EVAL,
                ("_call_impl", MODULE_PY, 1790),
                ("_wrapped_call_impl", MODULE_PY, 1779),
                ("_PyObject_MakeTpCall", "??"),
            ]
        )

    def _outer(self, runner_line: int, variant: int) -> list[Frame]:
        """From the model runner out to ``_start`` and the outermost ``<module>`` (in-process engine core)."""
        p = self.pool
        frames = [
            p.get("execute_model", RUNNER, runner_line),
            p.get("decorate_context", CONTEXTLIB_PY, 120),
            p.get("execute_model", f"{VLLM}/v1/worker/gpu_worker.py", 339),
            *p.many([EVAL, ("PyObject_Call", "??")]),
            p.get("collective_rpc", f"{VLLM}/executor/uniproc_executor.py", 58),
            p.get("step", f"{VLLM}/v1/engine/core.py", 248 + 2 * (variant % 3)),
            p.get("get_output", f"{VLLM}/v1/engine/core_client.py", 244),
            p.get("step", f"{VLLM}/v1/engine/llm_engine.py", 248),
            p.get("_run_engine", f"{VLLM}/entrypoints/llm.py", 1615),
            p.get("generate", f"{VLLM}/entrypoints/llm.py", 395),
            p.get("run_batch", USER_SCRIPT, 61 + 4 * (variant % 4)),
            p.get("main", USER_SCRIPT, 118),
        ]
        frames += p.many(
            [
                EVAL,
                ("PyEval_EvalCode", "??"),
                ("run_mod", "pythonrun.c"),
                ("_PyRun_SimpleFileObject", "??"),
                ("Py_RunMain", "??"),
                ("__libc_start_main", "??"),
                ("_start", "??"),
            ]
        )
        frames.append(p.get("<module>", USER_SCRIPT, 141))
        return frames

    def _model_path(self, where: str, variant: int, model_line: int = 301) -> list[Frame]:
        """Python frames from a model-internal call site out to the runner's ``self.model(...)`` call."""
        p = self.pool
        attn = [p.get("forward", USER_MODEL, 171 + variant)]
        mlp = [p.get("forward", USER_MODEL, 92 + variant)]
        layer = [p.get("forward", USER_MODEL, 238 if where == "attn" else 246)]
        model = [
            p.get("forward", USER_MODEL, model_line),
            p.get("__call__", f"{VLLM}/compilation/decorators.py", 239),
            *p.many([EVAL, ("_PyObject_MakeTpCall", "??")]),
            p.get("forward", USER_MODEL, 355),
        ]
        if where == "attn":
            chain = attn + self._module_call() + layer + self._module_call() + model
        elif where == "mlp":
            chain = mlp + self._module_call() + layer + self._module_call() + model
        elif where == "layer":
            chain = layer + self._module_call() + model
        else:  # "model": the model's own forward (embedding, final norm)
            chain = model
        return chain + self._module_call() + self._outer(1405, variant)

    def _site_python(self, site: str, variant: int) -> tuple[str, list[Frame]]:
        """(C++ chain kind, Python frames innermost first) of a named allocation site."""
        p = self.pool
        gemm = [
            p.get("default_unquantized_gemm", f"{VLLM}/model_executor/layers/utils.py", 74),
            p.get("apply", f"{VLLM}/model_executor/layers/linear.py", 191),
        ]
        custom_op = [p.get("forward", f"{VLLM}/model_executor/custom_op.py", 44)]
        sampler_out = [p.get("forward", SAMPLER, 83)] + self._module_call() + self._outer(1471, variant)
        if site in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            layer_line = {"qkv_proj": 510, "gate_up_proj": 510, "o_proj": 1337, "down_proj": 1337}[site]
            where = "attn" if site in ("qkv_proj", "o_proj") else "mlp"
            kind = "mm" if variant % 3 else "addmm"
            return kind, gemm + [
                p.get("forward", f"{VLLM}/model_executor/layers/linear.py", layer_line)
            ] + self._module_call() + self._model_path(where, variant)
        if site == "attn_out":
            return "empty", [
                p.get("forward", f"{VLLM}/attention/layer.py", 271 + variant % 2)
            ] + self._module_call() + self._model_path("attn", variant)
        if site == "flash_lse":
            return "flash_attn", [
                p.get("__call__", OPS_PY, 1243),
                p.get("flash_attn_varlen_func", f"{VLLM}/vllm_flash_attn/flash_attn_interface.py", 233),
                p.get("forward", FA_BACKEND, 573 + 6 * (variant % 2)),
                p.get("unified_attention_with_output", f"{VLLM}/attention/layer.py", 502),
                *p.many([EVAL, ("PyObject_Call", "??")]),
                p.get("__call__", OPS_PY, 1243),
                p.get("forward", f"{VLLM}/attention/layer.py", 289),
            ] + self._module_call() + self._model_path("attn", variant)
        if site == "silu_and_mul":
            return "empty", [
                p.get("forward_cuda", f"{VLLM}/model_executor/layers/activation.py", 101)
            ] + custom_op + self._module_call() + self._model_path("mlp", variant)
        if site == "first_rms_norm":
            return "empty_like", [
                p.get("forward_cuda", f"{VLLM}/model_executor/layers/layernorm.py", 198)
            ] + custom_op + self._module_call() + self._model_path("layer", variant)
        if site == "final_norm":
            return "empty_like", [
                p.get("forward_cuda", f"{VLLM}/model_executor/layers/layernorm.py", 198)
            ] + custom_op + self._module_call() + self._model_path("model", variant, 312)
        if site == "embed":
            return "embedding", [
                p.get("embedding", f"{DIST}/torch/nn/functional.py", 2542),
                p.get("forward", f"{VLLM}/model_executor/layers/vocab_parallel_embedding.py", 425),
            ] + self._module_call() + self._model_path("model", variant, 294)
        if site == "logits_index":
            return "index", self._outer(1441 + variant % 2, variant)
        if site in PREP_SITES:
            line = 640 + 7 * PREP_SITES.index(site)
            return "to_copy", [
                p.get("copy_to_gpu", f"{VLLM}/v1/utils.py", 121),
                p.get("_prepare_inputs", RUNNER, line + variant % 2),
            ] + self._outer(1378, variant)
        if site == "lm_head":
            return "mm", gemm + [
                p.get("_get_logits", f"{VLLM}/model_executor/layers/logits_processor.py", 98),
                p.get("forward", f"{VLLM}/model_executor/layers/logits_processor.py", 70),
            ] + self._module_call() + [p.get("compute_logits", USER_MODEL, 371)] + self._outer(1463, variant)
        if site == "prompt_logits":
            return "mm", gemm + [
                p.get("_get_logits", f"{VLLM}/model_executor/layers/logits_processor.py", 98),
                p.get("forward", f"{VLLM}/model_executor/layers/logits_processor.py", 70),
            ] + self._module_call() + [
                p.get("compute_logits", USER_MODEL, 371),
                p.get("_get_prompt_logprobs_dict", RUNNER, 2147),
            ] + self._outer(1498, variant)
        if site == "to_float":
            return "to_copy", [p.get("forward", SAMPLER, 65)] + self._module_call() + self._outer(
                1471, variant
            )
        if site in ("sort_values", "sort_indices"):
            return "sort", [
                p.get("apply_top_k_top_p", TOPKTOPP, 190),
                p.get("forward_native", TOPKTOPP, 102 + variant % 2),
                p.get("sample", SAMPLER, 132),
            ] + sampler_out
        if site == "softmax":
            return "softmax", [
                p.get("forward_native", TOPKTOPP, 104),
                p.get("sample", SAMPLER, 132),
            ] + sampler_out
        if site == "logprobs":
            return "log_softmax", [
                p.get("compute_logprobs", SAMPLER, 153),
                p.get("forward", SAMPLER, 68),
            ] + self._module_call() + self._outer(1471, variant)
        if site == "exponential":
            return "empty_like", [
                p.get("random_sample", TOPKTOPP, 281),
                p.get("forward_native", TOPKTOPP, 105),
                p.get("sample", SAMPLER, 132),
            ] + sampler_out
        if site == "div":
            return "binary", [
                p.get("random_sample", TOPKTOPP, 282),
                p.get("forward_native", TOPKTOPP, 105),
                p.get("sample", SAMPLER, 132),
            ] + sampler_out
        if site == "argmax":
            return "argmax", [
                p.get("random_sample", TOPKTOPP, 282),
                p.get("forward_native", TOPKTOPP, 105),
                p.get("sample", SAMPLER, 132),
            ] + sampler_out
        if site == "sampled_int32":
            return "to_copy", [p.get("forward", SAMPLER, 99)] + self._module_call() + self._outer(
                1471, variant
            )
        if site == "bin_counts":
            return "scatter", [
                p.get("get_token_bin_counts_and_mask", f"{VLLM}/model_executor/layers/utils.py", 24),
                p.get("apply_penalties", f"{VLLM}/model_executor/layers/utils.py", 50),
                p.get("apply_all_penalties", f"{VLLM}/v1/sample/ops/penalties.py", 31),
                p.get("apply_penalties", SAMPLER, 250),
                p.get("forward", SAMPLER, 72),
            ] + self._module_call() + self._outer(1471, variant)
        if site == "cublas_workspace":
            return "workspace", gemm + [
                p.get("forward", f"{VLLM}/model_executor/layers/linear.py", 510)
            ] + self._module_call() + self._model_path("attn", variant)
        if site == "persistent_buffer":
            return "empty", [
                p.get("__init__", f"{VLLM}/v1/worker/gpu_input_batch.py", 118 + 3 * variant),
                p.get("_update_states", RUNNER, 472),
            ] + self._outer(1371, variant)
        if site == "empty_cache":
            return "empty_cache", [
                p.get("empty_cache", f"{DIST}/torch/cuda/memory.py", 224),
                p.get("reset_prefix_cache", f"{VLLM}/v1/worker/gpu_worker.py", 388),
            ] + self._outer(1371, variant)
        if site.startswith("misc"):
            return self._misc_python(int(site[4:]))
        raise KeyError(site)

    def _misc_python(self, index: int) -> tuple[str, list[Frame]]:
        """A rarely hit allocation site: deterministic in its index, spread over many files and lines."""
        r = random.Random(index * 7919 + 17)
        module, functions = MISC_MODULES[index % len(MISC_MODULES)]
        path = f"{VLLM}/{module}"
        frames = [
            self.pool.get(functions[(index // len(MISC_MODULES)) % len(functions)], path, r.randint(20, 900))
        ]
        for _ in range(r.randint(1, 4)):
            frames.append(self.pool.get(r.choice(functions), path, r.randint(20, 900)))
        if r.random() < 0.4:
            module2, functions2 = r.choice(MISC_MODULES)
            frames.append(self.pool.get(r.choice(functions2), f"{VLLM}/{module2}", r.randint(20, 900)))
        return f"misc:{MISC_OPS[index % len(MISC_OPS)]}", frames + self._outer(r.randint(1300, 1600), index)

    def _cpp(self, kind: str) -> list[Frame]:
        if kind.startswith("misc:"):
            op = kind[5:]
            schema = (
                "(at::Tensor const&, at::Tensor const&)" if op.endswith("Tensor") else "(at::Tensor const&)"
            )
            ks = "(c10::DispatchKeySet, " + schema[1:]
            base = op.split("_")[0]
            chain = [
                *EMPTY_CUDA,
                (
                    "at::(anonymous namespace)::create_out(c10::ArrayRef<long>, c10::ArrayRef<long>, "
                    "c10::TensorOptions const&)",
                    "RegisterCUDA_0.cpp",
                ),
                (
                    "at::(anonymous "
                    f"namespace)::structured_{op}_out_functional::set_output_raw_strided(long, "
                    "c10::ArrayRef<long>, c10::ArrayRef<long>, c10::TensorOptions, "
                    "c10::ArrayRef<at::Dimname>)",
                    "RegisterCUDA_0.cpp",
                ),
                (f"at::meta::structured_{op}::meta{schema}", "??"),
                *_dispatch(op, schema),
                (f"at::_ops::{op}::redispatch{ks}", "??"),
                (
                    f"torch::autograd::VariableType::(anonymous namespace)::{op}{ks}",
                    f"VariableType_{len(op) % 5}.cpp",
                ),
                (f"at::_ops::{op}::call{schema}", "??"),
                (
                    f"torch::autograd::THPVariable_{base}(_object*, _object*, _object*)",
                    "python_variable_methods.cpp",
                ),
            ]
        elif kind == "empty_cache":
            chain = [
                (
                    "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::release_cached_blocks("
                    "std::shared_ptr<c10::GatheredContext> const&, c10::cuda::MempoolId_t)",
                    "CUDACachingAllocator.cpp",
                ),
                (
                    "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::emptyCache(c10::cuda::"
                    "MempoolId_t)",
                    "CUDACachingAllocator.cpp",
                ),
                (
                    "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::emptyCache(c10::cuda::"
                    "MempoolId_t)",
                    "",
                ),
                ("THCPModule_emptyCache(_object*, _object*)", "Module.cpp"),
            ]
        else:
            chain = CPP_CHAINS[kind]
        return self.pool.many([*chain, ("cfunction_call", "??"), EVAL])

    # -- public --------------------------------------------------------------------------------------------
    def alloc_stack(self, site: str, variant: int) -> Stack:
        """Stack of an allocation made by ``site`` (for ``empty_cache``: of its segment_free entries)."""
        key = (site, variant)
        stack = self._alloc.get(key)
        if stack is None:
            kind, python = self._site_python(site, variant)
            # The three unwinder frames always come first; emptyCache does not go through malloc.
            prefix = ALLOC_PREFIX[:3] if kind == "empty_cache" else ALLOC_PREFIX
            stack = tuple(self.pool.many(prefix) + self._cpp(kind) + python)
            self._alloc[key] = stack
        return stack

    def free_stack(self, site: str, variant: int) -> Stack:
        """Stack of a free that happens while the code of ``site`` runs (a Python reference dropped)."""
        key = (site, variant)
        stack = self._free.get(key)
        if stack is None:
            kind, python = self._site_python(site, variant)
            middle = FREE_FROM_CPP if kind in ("flash_attn", "sort") else FREE_FROM_PYTHON
            cpp = self.pool.many([*FREE_PREFIX, *middle, EVAL])
            stack = tuple(cpp + python)
            self._free[key] = stack
        return stack

    @property
    def n_stacks(self) -> int:
        stacks = [*self._alloc.values(), *self._free.values()]
        return len({tuple(map(id, stack)) for stack in stacks})


# ---------------------------------------------------------------------------------------------------------
# The caching allocator model.


class Allocator:
    """A compact model of DeviceCachingAllocator for one device and one stream.

    Blocks are identified by address; each segment's blocks form a doubly linked list in address order.
    Free blocks sit in one sorted list per pool keyed by ``(size << 48) | address`` (best fit, then lowest
    address).
    ``events`` receives ("segment_alloc" | "segment_free", address, size) as segments come and go.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.next_va = BASE_ADDRESS
        self.reserved = 0
        self.size: dict[int, int] = {}
        self.prev: dict[int, int] = {}  # 0 = first block of its segment
        self.next: dict[int, int] = {}  # 0 = last block of its segment
        self.seg_of: dict[int, int] = {}
        self.used: set[int] = set()
        self.requested: dict[int, int] = {}  # stale for free blocks, as in torch
        self.segments: dict[int, tuple[int, bool]] = {}  # address -> (total_size, small pool)
        self.free_small: list[int] = []
        self.free_large: list[int] = []
        self.events: list[tuple[str, int, int]] = []

    def _free_list(self, block: int) -> list[int]:
        return self.free_small if self.segments[self.seg_of[block]][1] else self.free_large

    @staticmethod
    def _remove(lst: list[int], key: int) -> None:
        i = bisect_left(lst, key)
        del lst[i]

    def _new_segment(self, seg_size: int, small: bool) -> int:
        if self.reserved + seg_size > self.capacity:
            self.release_cached()
        addr = self.next_va
        # The next mapping starts 2 MiB-aligned, after a guard gap.
        self.next_va += (seg_size + 2 * MiB - 1) // (2 * MiB) * (2 * MiB) + 2 * MiB
        assert self.next_va < 1 << ADDR_BITS
        self.reserved += seg_size
        self.segments[addr] = (seg_size, small)
        self.size[addr] = seg_size
        self.prev[addr] = 0
        self.next[addr] = 0
        self.seg_of[addr] = addr
        self.requested[addr] = seg_size
        self.events.append(("segment_alloc", addr, seg_size))
        return addr

    def malloc(self, requested: int, fresh: bool = False) -> int:
        """Best fit from the cache, else a new segment (always a new one when ``fresh``)."""
        rounded = round_size(requested)
        small = rounded <= MiB
        lst = self.free_small if small else self.free_large
        i = len(lst) if fresh else bisect_left(lst, rounded << ADDR_BITS)
        if i < len(lst):
            key = lst.pop(i)
            block = key & ((1 << ADDR_BITS) - 1)
        else:
            block = self._new_segment(segment_bytes(rounded), small)
        size = self.size[block]
        remaining = size - rounded
        if (remaining >= 512) if small else (remaining > MiB):
            rest = block + rounded
            nxt = self.next[block]
            self.size[block] = rounded
            self.size[rest] = remaining
            self.prev[rest] = block
            self.next[rest] = nxt
            self.next[block] = rest
            if nxt:
                self.prev[nxt] = rest
            self.seg_of[rest] = self.seg_of[block]
            self.requested[rest] = self.requested[block]
            insort(lst, (remaining << ADDR_BITS) | rest)
        self.used.add(block)
        self.requested[block] = requested
        return block

    def free(self, block: int) -> None:
        self.used.remove(block)
        lst = self._free_list(block)
        size = self.size[block]
        prv = self.prev[block]
        if prv and prv not in self.used:
            self._remove(lst, (self.size[prv] << ADDR_BITS) | prv)
            size += self.size[prv]
            self._unlink(block)
            block = prv
        nxt = self.next[block]
        if nxt and nxt not in self.used:
            self._remove(lst, (self.size[nxt] << ADDR_BITS) | nxt)
            size += self.size[nxt]
            self._unlink(nxt)
        self.size[block] = size
        insort(lst, (size << ADDR_BITS) | block)

    def _unlink(self, block: int) -> None:
        """Remove ``block`` from its segment's list (its bytes are absorbed by its predecessor)."""
        prv, nxt = self.prev.pop(block), self.next.pop(block)
        if prv:
            self.next[prv] = nxt
        if nxt:
            self.prev[nxt] = prv
        del self.size[block], self.seg_of[block], self.requested[block]

    def release_cached(self) -> int:
        """``release_cached_blocks``: cudaFree every segment that is one free block. Returns how many."""
        released = 0
        # torch's release_blocks walks each pool's free set in (stream, size, address) order, the large pool first
        order = sorted(self.segments, key=lambda a: (self.segments[a][1], self.segments[a][0], a))
        for addr in order:
            total, small = self.segments[addr]
            if addr in self.used or self.size[addr] != total:
                continue
            self._remove(self.free_small if small else self.free_large, (total << ADDR_BITS) | addr)
            del self.size[addr], self.prev[addr], self.next[addr], self.seg_of[addr], self.requested[addr]
            del self.segments[addr]
            self.reserved -= total
            self.events.append(("segment_free", addr, total))
            released += 1
        return released

    def blocks(self, segment: int) -> list[tuple[int, int]]:
        out = []
        block = segment
        while block:
            out.append((block, self.size[block]))
            block = self.next[block]
        return out


# ---------------------------------------------------------------------------------------------------------
# The workload: an eager vLLM-style engine stepping a Llama-8B-class model.

Tensor = tuple[int, int]  # (address, requested bytes)


class Recorder:
    """Drives the allocator and writes the trace entries (only while ``recording``)."""

    def __init__(self, target: int, rng: random.Random, stacks: StackLibrary,
                 capacity: int = DEVICE_CAPACITY) -> None:
        self.target = target
        self.rng = rng
        self.stacks = stacks
        self.alloc = Allocator(capacity)
        self.trace: list[Entry] = []
        self.recording = False
        self.t = START_TIME_US
        self.variant = 0
        self.frames_of: dict[int, list[Frame]] = {}  # live block -> frames list of its alloc entry
        self.annotations: list[dict[str, Any]] = []

    # -- time ----------------------------------------------------------------------------------------------
    def tick(self, lo: int = 0, hi: int = 40) -> None:
        self.t += self.rng.randint(lo, hi)

    def idle(self, us: int) -> None:
        self.t += us

    # -- the two primitives --------------------------------------------------------------------------------
    def A(self, site: str, size: int, fresh: bool = False) -> Tensor:
        """Allocate ``size`` bytes from ``site`` (one alloc entry, plus any segment entries it causes)."""
        if not self.recording:
            addr = self.alloc.malloc(size, fresh)
            self.alloc.events.clear()
            self.frames_of[addr] = []
            return addr, size
        if len(self.trace) >= self.target - 4:
            raise _WindowFull
        self.t += self.rng.randint(1, 30)
        frames = list(self.stacks.alloc_stack(site, self.variant))
        addr = self.alloc.malloc(size)
        self._flush_segment_events(frames)
        self.trace.append(
            {
                "action": "alloc",
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": self.t,
                "compile_context": "N/A",
                "user_metadata": "",
                "frames": frames,
            }
        )
        self.frames_of[addr] = frames
        return addr, size

    def F(self, tensor: Tensor, site: str) -> None:
        """Free ``tensor`` while ``site``'s code runs (free_requested and free_completed share frames)."""
        addr, size = tensor
        if not self.recording:
            self.alloc.free(addr)
            del self.frames_of[addr]
            return
        if len(self.trace) >= self.target - 4:
            raise _WindowFull
        self.t += self.rng.randint(0, 12)
        frames = list(self.stacks.free_stack(site, self.variant))
        t = self.t
        self.trace.append(
            {
                "action": "free_requested",
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": t,
                "compile_context": "N/A",
                "user_metadata": "",
                "frames": frames,
            }
        )
        self.trace.append(
            {
                "action": "free_completed",
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": t,
                "compile_context": "N/A",
                "user_metadata": "",
                "frames": frames,
            }
        )
        self.alloc.free(addr)
        del self.frames_of[addr]

    def empty_cache(self) -> None:
        frames = list(self.stacks.alloc_stack("empty_cache", 0))
        self.t += self.rng.randint(50, 400)
        self.alloc.release_cached()
        self._flush_segment_events(frames)

    def _flush_segment_events(self, frames: list[Frame]) -> None:
        for action, addr, size in self.alloc.events:
            self.trace.append(
                {
                    "action": action,
                    "addr": addr,
                    "size": size,
                    "stream": 0,
                    "time_us": self.t,
                    "compile_context": "N/A",
                    "user_metadata": "",
                    "frames": frames,
                }
            )
        self.alloc.events.clear()

    def annotate(self, name: str, stage: str) -> None:
        if self.recording:
            self.annotations.append({"stage": stage, "name": name, "device": 0, "time_us": self.t})

    def pad_to_target(self) -> None:
        """Top the trace up to exactly ``target`` entries with small allocations that need no new segment."""
        filler = list(self.stacks.alloc_stack("misc0", 0))
        while len(self.trace) < self.target:
            if not self.alloc.free_small:
                break  # practically unreachable; the trace then ends a few entries short
            self.t += self.rng.randint(1, 30)
            addr = self.alloc.malloc(512)
            assert not self.alloc.events
            self.trace.append(
                {
                    "action": "alloc",
                    "addr": addr,
                    "size": 512,
                    "stream": 0,
                    "time_us": self.t,
                    "compile_context": "N/A",
                    "user_metadata": "",
                    "frames": filler,
                }
            )
            self.frames_of[addr] = filler
            filler = list(filler)


class ServingRun:
    """Tensor-level model of the serving loop; see the module docstring."""

    def __init__(self, rec: Recorder, rng: random.Random, pinned_segments: int = 0) -> None:
        self.rec = rec
        self.rng = rng
        self.pinned_segments = pinned_segments
        self.pinned: list[Tensor] = []
        self.weights: list[Tensor] = []
        self.leftovers: list[Tensor] = []
        self.persistent: dict[str, Tensor] = {}
        self.persistent_capacity = 64
        self.sampled_prev: Tensor | None = None
        self.batch = 32
        self.steps = 0
        self.profiling = False
        self.kept: list[tuple[int, Tensor]] = []  # (step to free it at, tensor), kept sorted by step

    def load(self) -> None:
        """Everything before the recorded window: weights, a profile run, the KV cache, warm-up."""
        A = self.rec.A
        self.weights.append(A("embed", VOCAB * HIDDEN * BF16))
        for _ in range(N_LAYERS):
            self.weights.append(A("qkv_proj", HIDDEN * (HIDDEN + 2 * KV_DIM) * BF16))
            self.weights.append(A("o_proj", HIDDEN * HIDDEN * BF16))
            self.weights.append(A("gate_up_proj", HIDDEN * 2 * INTERMEDIATE * BF16))
            self.weights.append(A("down_proj", INTERMEDIATE * HIDDEN * BF16))
            self.weights.append(A("first_rms_norm", HIDDEN * BF16))
            self.weights.append(A("first_rms_norm", HIDDEN * BF16))
        self.weights.append(A("final_norm", HIDDEN * BF16))
        self.weights.append(A("lm_head", VOCAB * HIDDEN * BF16))
        self.weights.append(A("misc1", 131072 * 128 * 4))  # rotary cos/sin cache
        for name in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "frequency_penalties",
            "presence_penalties",
            "repetition_penalties",
            "generators",
        ):
            self.persistent[name] = A("persistent_buffer", self.persistent_capacity * 4)
        # Profile run at the max batched tokens, then vLLM sizes and allocates the KV cache.
        self.step(prefill_tokens=8192, seqs=256)
        for _ in range(N_LAYERS):
            self.weights.append(A("persistent_buffer", KV_CACHE_PER_LAYER))
        # Leftovers of the dummy sampler run, still referenced when recording starts.
        for size in (
            MAX_NUM_SEQS * VOCAB * 4,
            MAX_NUM_SEQS * VOCAB * 4,
            MAX_NUM_SEQS * 8,
            8192 * 4,
            8192 * 8,
            MAX_NUM_SEQS * MAX_BLOCKS_PER_SEQ * 4,
            3 * MiB + 4096,
            700_000,
            12_288,
            4096,
        ):
            self.leftovers.append(A("misc2", size))
        for batch in (1, 8, 64, 256):
            self.step(prefill_tokens=0, seqs=batch)
        # The segment-heavy shape: a long run that never called empty_cache() and left one small long-lived
        # tensor (a cached index, a handle) in each of many segments, every one of them a fresh segment.
        sizes = (512, 4096, 12_288, 65_536)
        for i in range(self.pinned_segments):
            self.pinned.append(A(f"misc{3 + i % N_MISC_SITES}", sizes[self.rng.randrange(len(sizes))], fresh=True))

    def run(self) -> None:
        rng = self.rng
        rec = self.rec
        rec.recording = True
        expected_steps = max(20, rec.target // 640)  # about 640 trace entries per step
        profiled = {int(expected_steps * f) for f in (0.05, 0.3, 0.6, 0.85)}
        cache_resets = {int(expected_steps * 0.35), int(expected_steps * 0.7)}
        try:
            while True:
                self.steps += 1
                # Prefill when new requests arrive; otherwise decode the running batch.
                if rng.random() < 0.15:
                    tokens = rng.choice((256, 512, 1024, 2048, 2048, 4096, 8192))
                    seqs = rng.randint(1, 8)
                else:
                    # Running requests drift around a typical load of ~48 and occasionally spike.
                    drift = rng.randint(-6, 6) + (48 - self.batch) // 12
                    self.batch = max(1, min(MAX_NUM_SEQS, self.batch + drift))
                    tokens, seqs = 0, self.batch
                rec.variant = rng.randrange(4)
                self.profiling = self.steps in profiled
                if self.profiling:
                    rec.annotate("gpu_model_runner: execute_model", "START")
                self.step(prefill_tokens=tokens, seqs=seqs)
                if self.profiling:
                    rec.annotate("gpu_model_runner: execute_model", "END")
                if self.steps in cache_resets:  # the user script resets the prefix cache: empty_cache()
                    rec.empty_cache()
                rec.idle(rng.randint(150, 900) if rng.random() < 0.97 else rng.randint(50_000, 2_000_000))
        except _WindowFull:
            rec.pad_to_target()
        # A profiled step cut off by the end of the window leaves its spans open, as torch would.

    def step(self, prefill_tokens: int, seqs: int) -> None:
        rec, rng = self.rec, self.rng
        A, F = rec.A, rec.F
        T = prefill_tokens + (0 if prefill_tokens else seqs)
        B = seqs
        prefill = prefill_tokens > 0

        # Leftovers from before the window go when the first recorded step updates the input batch.
        while self.leftovers and rec.recording:
            F(self.leftovers.pop(), "persistent_buffer")
        if B > self.persistent_capacity:
            self.persistent_capacity = min(MAX_NUM_SEQS, max(B, 2 * self.persistent_capacity))
            for name, old in list(self.persistent.items()):
                self.persistent[name] = A("persistent_buffer", self.persistent_capacity * 4)
                F(old, "persistent_buffer")
        if self.steps in (3, 9) and rec.recording:
            self.persistent[f"cublas_workspace_{self.steps}"] = A("cublas_workspace", 32 * MiB + 4096)

        inputs = [
            A("prep_input_ids", T * 4),
            A("prep_positions", T * 8),
            A("prep_slot_mapping", T * 8),
            A("prep_query_start_loc", (B + 1) * 4),
            A("prep_seq_lens", B * 4),
            A("prep_block_table", B * MAX_BLOCKS_PER_SEQ * 4),
            A("prep_logits_indices", B * 8),
        ]
        if self.sampled_prev is not None:
            F(self.sampled_prev, "persistent_buffer")
            self.sampled_prev = None
        # The long tail: rarely hit sites (structured output, spec decode, penalties, LoRA, ...). Most of
        # those tensors die within the step; a few are kept for some steps (and may be live at the end).
        for _ in range(rng.randint(1, 4) if rng.random() < 0.5 else 0):
            site = f"misc{3 + (rng.randrange(20) if rng.random() < 0.5 else rng.randrange(N_MISC_SITES))}"
            size = rng.choice(
                (512, 4096, 65536, B * 4, B * VOCAB // 8, T * 16, 3 * MiB + 512 * rng.randrange(64))
            )
            tensor = A(site, size)
            if rng.random() < 0.06:
                insort(self.kept, (self.steps + rng.randint(1, 400), tensor))
            else:
                F(tensor, "prep_block_table")
        while self.kept and self.kept[0][0] <= self.steps:
            F(self.kept.pop(0)[1], "prep_block_table")

        hidden = A("embed", T * HIDDEN * BF16)
        residual = hidden
        hidden = A("first_rms_norm", T * HIDDEN * BF16)
        for _ in range(N_LAYERS):
            rec.tick()
            qkv = A("qkv_proj", T * (HIDDEN + 2 * KV_DIM) * BF16)
            F(hidden, "qkv_proj")  # normalised in place by the fused add+RMSNorm, consumed by qkv_proj
            out = A("attn_out", T * HIDDEN * BF16)
            lse = A("flash_lse", N_HEADS * T * 4)
            rec.tick(5, 60 if prefill else 15)
            F(lse, "flash_lse")
            F(qkv, "attn_out")
            o = A("o_proj", T * HIDDEN * BF16)
            F(out, "o_proj")
            gate_up = A("gate_up_proj", T * 2 * INTERMEDIATE * BF16)
            act = A("silu_and_mul", T * INTERMEDIATE * BF16)
            F(gate_up, "silu_and_mul")
            hidden = A("down_proj", T * HIDDEN * BF16)
            F(act, "down_proj")
            F(o, "down_proj")
        normed = A("final_norm", T * HIDDEN * BF16)
        F(hidden, "final_norm")
        F(residual, "final_norm")

        if prefill and rng.random() < 0.04:  # a request asked for prompt logprobs: logits for every token
            full = A("prompt_logits", min(T, 2048) * VOCAB * BF16)
            F(full, "prompt_logits")
        picked = A("logits_index", B * HIDDEN * BF16)
        F(normed, "logits_index")
        logits16 = A("lm_head", B * VOCAB * BF16)
        F(picked, "lm_head")
        logits = A("to_float", B * VOCAB * 4)
        F(logits16, "to_float")
        if self.profiling:
            rec.annotate("gpu_model_runner: sample", "START")
        if rng.random() < 0.1:
            lp = A("logprobs", B * VOCAB * 4)
            F(lp, "logprobs")
        if rng.random() < 0.3:
            counts = A("bin_counts", B * (VOCAB + 1) * 8)
            F(counts, "bin_counts")
        if rng.random() < 0.5:
            values = A("sort_values", B * VOCAB * 4)
            indices = A("sort_indices", B * VOCAB * 8)
            F(values, "sort_values")
            F(indices, "softmax")
        probs = A("softmax", B * VOCAB * 4)
        q = A("exponential", B * VOCAB * 4)
        ratio = A("div", B * VOCAB * 4)
        F(q, "div")
        sampled = A("argmax", B * 8)
        F(ratio, "argmax")
        F(probs, "argmax")
        F(logits, "sampled_int32")
        self.sampled_prev = A("sampled_int32", B * 4)
        F(sampled, "sampled_int32")
        if self.profiling:
            rec.annotate("gpu_model_runner: sample", "END")
        for tensor in reversed(inputs):
            F(tensor, "sampled_int32")


# ---------------------------------------------------------------------------------------------------------
# Assembling the snapshot.


def build_segments(rec: Recorder) -> list[dict[str, Any]]:
    alloc = rec.alloc
    segments = []
    for addr in sorted(alloc.segments):
        total, small = alloc.segments[addr]
        blocks = []
        allocated = requested = 0
        for block, size in alloc.blocks(addr):
            if block in alloc.used:
                req = alloc.requested[block]
                blocks.append(
                    {
                        "address": block,
                        "size": size,
                        "requested_size": req,
                        "state": "active_allocated",
                        "frames": rec.frames_of[block],
                    }
                )
                allocated += size
                requested += req
            else:
                blocks.append(
                    {
                        "address": block,
                        "size": size,
                        "requested_size": alloc.requested[block],
                        "state": "inactive",
                        "frames": [],
                    }
                )
        segments.append(
            {
                "device": 0,
                "address": addr,
                "total_size": total,
                "allocated_size": allocated,
                "active_size": allocated,
                "requested_size": requested,
                "stream": 0,
                "segment_type": "small" if small else "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            }
        )
    return segments


def generate(events: int, seed: int, segments: int = 0) -> tuple[dict[str, Any], dict[str, int]]:
    """Build the snapshot dict for a trace of ``events`` entries, with ``segments`` pinned small segments
    added before the window (the segment-heavy shape; 0: the serving run's own ~180). Returns (snapshot,
    stats)."""
    if events < 100:
        raise ValueError("--events must be at least 100")
    if segments < 0:
        raise ValueError("--segments must not be negative")
    rng = random.Random(seed)
    stacks = StackLibrary()
    # Room for the pinned 2 MiB segments beside the serving run's ~140 GiB (more than one GPU holds: the
    # shape is about the loader's cost per segment, not about a device).
    rec = Recorder(events, rng, stacks, DEVICE_CAPACITY + segments * 2 * MiB)
    run = ServingRun(rec, rng, segments)
    run.load()
    run.run()
    segments = build_segments(rec)
    snapshot: dict[str, Any] = {
        "segments": segments,
        "device_traces": [rec.trace],
        "allocator_settings": ALLOCATOR_SETTINGS,
        "external_annotations": rec.annotations,
    }
    stats = {
        "trace_entries": len(rec.trace),
        "steps": run.steps,
        "segments": len(segments),
        "distinct_frames": len(stacks.pool),
        "distinct_stacks": stacks.n_stacks,
        "reserved_bytes": rec.alloc.reserved,
    }
    return snapshot, stats


def distinct_stacks(snapshot: dict[str, Any], stacks: int, seed: int, frames: int = 850) -> None:
    """The many-stacks shape: every recorded stack is replaced by one of `stacks` distinct stacks of 25–55 frames
    drawn at random (random nesting: no call tree a frame always sits in) from `frames` distinct frames, a third
    of them C++; what shared a frames list keeps sharing one (a free pair, a block and its alloc). In place."""
    rng = random.Random(seed ^ 0x5EED)
    pool: list[dict[str, Any]] = []
    for i in range(frames):
        if i % 3 == 0:
            pool.append({"filename": "??", "line": 0, "name": f"at::native::kernel_{i}(at::Tensor const&)"})
        else:
            package = rng.choice(("vllm/model_executor/layers", "torch/nn/modules", "transformers/models/llama",
                                  "myproject/serving", "flash_attn", "torch/_ops"))
            pool.append({"filename": f"/usr/lib/python3/site-packages/{package}/mod_{i % 97}.py",
                         "line": rng.randint(1, 2000), "name": f"fn_{i}"})
    made = [[rng.choice(pool) for _ in range(rng.randint(25, 55))] for _ in range(stacks)]
    by_list: dict[int, list[dict[str, Any]]] = {}

    def new(old: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not old:
            return old
        got = by_list.get(id(old))
        if got is None:
            got = by_list[id(old)] = list(made[rng.randrange(stacks)])
        return got
    keep = []                                  # the original lists stay alive, so that their ids stay unique
    for trace in snapshot["device_traces"]:
        for e in trace:
            keep.append(e.get("frames"))
            e["frames"] = new(e.get("frames") or [])
    for seg in snapshot["segments"]:
        for b in seg["blocks"]:
            if "frames" in b:
                keep.append(b["frames"])
                b["frames"] = new(b["frames"] or [])
    del keep


def _count(n: int) -> str:
    if n and n % 1_000_000 == 0:
        return f"{n // 1_000_000}m"
    if n and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def default_name(events: int, segments: int = 0, stacks: int = 0) -> str:
    """``large-1m.pickle``; ``large-1m-250kseg.pickle`` with 250k pinned segments; ``large-1m-4kstacks.pickle``
    with 4,000 distinct random stacks."""
    return (f"large-{_count(events)}{f'-{_count(segments)}seg' if segments else ''}"
            f"{f'-{_count(stacks)}stacks' if stacks else ''}.pickle")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--events", type=int, default=1_000_000, help="trace entries to generate (default 1M)"
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="output pickle (default benchmarks/data/large-<N>.pickle)",
    )
    parser.add_argument(
        "--segments", type=int, default=0,
        help="the segment-heavy shape: add N small segments, each pinned by one long-lived tensor allocated "
             "in a fresh segment before the window (default 0: the run's own ~180 segments)",
    )
    parser.add_argument("--distinct-stacks", type=int, default=0,
                        help="the many-stacks shape: replace the stacks by N distinct random ones of 25-55 frames "
                             "from 850 frames, a third C++ (default 0: the run's own stacks)")
    parser.add_argument("--seed", type=int, default=20251130, help="random seed (default 20251130)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output file")
    args = parser.parse_args(argv)

    out: Path = args.output or Path(__file__).resolve().parent / "data" / default_name(args.events, args.segments,
                                                                                     args.distinct_stacks)
    if args.events < 100:
        parser.error("--events must be at least 100")
    if args.segments < 0:
        parser.error("--segments must not be negative")
    if out.exists() and not args.force:
        print(f"generate: {out} exists; pass --force to overwrite", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    snapshot, stats = generate(args.events, args.seed, args.segments)
    if args.distinct_stacks:
        distinct_stacks(snapshot, args.distinct_stacks, args.seed)
    t1 = time.perf_counter()
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            pickle.dump(snapshot, f, protocol=4)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    t2 = time.perf_counter()
    size = out.stat().st_size
    print(
        f"generate: wrote {out} ({size / MiB:.1f} MiB): {stats['trace_entries']} trace entries, "
        f"{stats['steps']} steps, {stats['segments']} segments, {stats['distinct_frames']} distinct frames, "
        f"{stats['distinct_stacks']} distinct stacks, reserved {stats['reserved_bytes'] / GiB:.1f} GiB; "
        f"simulate {t1 - t0:.1f} s, pickle {t2 - t1:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
