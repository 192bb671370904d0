//! Which CUDA libraries a recorded run loaded, read off its stack frames: the memory they hold
//! (cuBLAS and cuDNN handles, kernel images) is outside the allocator, so a snapshot does not
//! show it, but the C++ frames PyTorch records (`stacks="all"`, the default) name the library
//! calls that allocated through it: the cuBLAS workspace (`at::cuda::getCurrentCUDABlasHandle`),
//! GEMM outputs (`at::cuda::blas::gemm...`), cuDNN convolutions and batch norms
//! (`at::native::cudnn_convolution...`).

/// `(uses_gemm, uses_conv)` by the frames' function names. `None` when no frame is a C++
/// frame (the run recorded Python frames only, or none), or when a `torch.compile`d run shows
/// no GEMM: the absence of a library call then says nothing.
pub fn from_frame_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<(bool, bool)> {
    let (mut cpp, mut gemm, mut conv, mut compiled) = (false, false, false, false);
    for name in names {
        // torch.compile'd code allocates its GEMM outputs in generated code that names no op,
        // and calls cuBLAS through extern kernels no frame shows.
        compiled |= name.contains("dynamo") || name.contains("inductor") || name == "call_func_at_runtime_with_args";
        // Python frames are bare function names; C++ ones are qualified.
        if !name.contains("::") {
            continue;
        }
        cpp = true;
        let l = name.to_ascii_lowercase();
        gemm |= l.contains("cublas") || l.contains("cuda::blas::") || l.contains("cudablas") || cuda_gemm_kernel(name);
        conv |= l.contains("cudnn") || l.contains("miopen");
    }
    // A compiled run without a GEMM in sight may still have run them: unknown, not absent.
    (cpp && (gemm || !compiled)).then_some((gemm, conv))
}

/// The ops whose CUDA kernels run cuBLAS (the symbolic tracer's `CUBLAS_OPS`, with the fp8 and
/// int8 GEMMs): a GEMM's output is allocated in its CUDA wrapper (`wrapper_CUDA_mm`) before
/// cuBLAS is called, so the allocation's stack names the op, not the library.
const CUBLAS_OPS: &[&str] = &[
    "mm",
    "bmm",
    "addmm",
    "baddbmm",
    "addbmm",
    "_addmm_activation",
    "mv",
    "addmv",
    "dot",
    "vdot",
    "_scaled_mm",
    "_int_mm",
];

/// Whether a C++ frame is the CUDA kernel wrapper of a cuBLAS op (`wrapper_CUDA_mm`, its out and
/// in-place forms `wrapper_CUDA_mm_out_out`, `wrapper_CUDA_addmm_`).
fn cuda_gemm_kernel(name: &str) -> bool {
    let Some((_, rest)) = name.split_once("wrapper_CUDA_") else { return false };
    let op = rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next().unwrap_or("");
    let op = op.strip_suffix("_out_out").or_else(|| op.strip_suffix("_out")).unwrap_or(op);
    // The output-dtype overloads (`mm.dtype`, `bmm.dtype`, `addmm.dtype`).
    let op = op.strip_suffix("_dtype").unwrap_or(op);
    let op = op.strip_suffix('_').unwrap_or(op);
    CUBLAS_OPS.contains(&op)
}

#[cfg(test)]
mod tests {
    use super::from_frame_names;

    fn check(names: &[&str], expect: Option<(bool, bool)>) {
        assert_eq!(from_frame_names(names.iter().copied()), expect, "{names:?}");
    }

    #[test]
    fn libraries_by_frame_names() {
        check(&[], None);
        check(&["forward", "_call_impl", "<module>"], None);
        check(&["at::cuda::getCurrentCUDABlasHandle()", "forward"], Some((true, false)));
        check(&["void at::cuda::blas::gemm_and_bias<float>(bool, bool)"], Some((true, false)));
        check(&["at::native::cudnn_convolution_backward(at::Tensor const&)"], Some((false, true)));
        check(&["at::_ops::cudnn_batch_norm_backward::redispatch(c10::DispatchKeySet)"], Some((false, true)));
        // A GEMM's output is allocated in its CUDA wrapper, before cuBLAS is called.
        check(
            &["at::(anonymous namespace)::wrapper_CUDA_mm(at::Tensor const&, at::Tensor const&)"],
            Some((true, false)),
        );
        check(&["at::(anonymous namespace)::wrapper_CUDA_bmm(at::Tensor const&)"], Some((true, false)));
        check(&["at::(anonymous namespace)::wrapper_CUDA_addmm_out_out(at::Tensor const&)"], Some((true, false)));
        check(&["at::(anonymous namespace)::wrapper_CUDA_addmm_(at::Tensor&)"], Some((true, false)));
        check(&["at::(anonymous namespace)::wrapper_CUDA_mm_dtype(at::Tensor const&)"], Some((true, false)));
        // Not GEMMs: names that start like one.
        check(&["at::(anonymous namespace)::wrapper_CUDA_mul_Tensor(at::Tensor const&)"], Some((false, false)));
        check(&["at::(anonymous namespace)::wrapper_CUDA_mmx(at::Tensor const&)"], Some((false, false)));
        // A compiled run hides its GEMMs: unknown unless one shows.
        check(&["dynamo__custom_eval_frame", "at::detail::empty_cuda(c10::ArrayRef<long>)"], None);
        check(&["call_func_at_runtime_with_args", "at::cuda::blas::gemm<float>(char)"], Some((true, false)));
        // C++ frames that call neither library: both are known absent.
        check(&["at::native::empty_cuda(c10::ArrayRef<long>)", "forward"], Some((false, false)));
    }
}
