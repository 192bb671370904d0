//! Which CUDA libraries a recorded run loaded, read off its stack frames: the memory they hold
//! (cuBLAS and cuDNN handles, kernel images) is outside the allocator, so a snapshot does not
//! show it, but the C++ frames PyTorch records (`stacks="all"`, the default) name the library
//! calls that allocated through it: the cuBLAS workspace (`at::cuda::getCurrentCUDABlasHandle`),
//! GEMM outputs (`at::cuda::blas::gemm...`), cuDNN convolutions and batch norms
//! (`at::native::cudnn_convolution...`).

/// `(uses_gemm, uses_conv)` by the frames' function names. `None` when no frame is a C++
/// frame (the run recorded Python frames only, or none): the absence of a library call then
/// says nothing.
pub fn from_frame_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<(bool, bool)> {
    let (mut cpp, mut gemm, mut conv) = (false, false, false);
    for name in names {
        // Python frames are bare function names; C++ ones are qualified.
        if !name.contains("::") {
            continue;
        }
        cpp = true;
        let l = name.to_ascii_lowercase();
        gemm |= l.contains("cublas") || l.contains("cuda::blas::") || l.contains("cudablas");
        conv |= l.contains("cudnn") || l.contains("miopen");
    }
    cpp.then_some((gemm, conv))
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
        // C++ frames that call neither library: both are known absent.
        check(&["at::native::empty_cuda(c10::ArrayRef<long>)", "forward"], Some((false, false)));
    }
}
