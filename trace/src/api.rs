//! The API that made an event, spelled exactly as CUDA spells it. Codes are pinned; new entries
//! are only appended. Tools read these names (`memsim stats --json` `calls`), so never rename one.

use bincode::{
    de::Decoder,
    enc::Encoder,
    error::{DecodeError, EncodeError},
    Decode, Encode,
};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

macro_rules! apis {
    ($($variant:ident = $code:literal => $name:literal,)*) => {
        /// An API entry point (or a framework-level pseudo-API such as `allocator`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(non_camel_case_types)]
        pub enum Api {
            $(
                #[doc = concat!("`", $name, "`")]
                $variant,
            )*
            /// A code this version does not know (written by a newer producer).
            Unknown(u16),
        }

        impl Api {
            /// Every known API, in the order they were added (codes are pinned, not sorted).
            pub const ALL: &'static [Api] = &[$(Api::$variant,)*];

            /// The pinned numeric code.
            #[inline]
            pub fn code(self) -> u16 {
                match self {
                    $(Api::$variant => $code,)*
                    Api::Unknown(c) => c,
                }
            }

            /// The API for a code; unknown codes are kept as [`Api::Unknown`].
            // Always inlined: the trace decoder calls it for every record, and a call costs
            // more than the lookup table the match compiles to.
            #[inline(always)]
            pub fn from_code(code: u16) -> Api {
                match code {
                    $($code => Api::$variant,)*
                    c => Api::Unknown(c),
                }
            }

            /// The exact entry-point name.
            pub fn name(self) -> &'static str {
                match self {
                    $(Api::$variant => $name,)*
                    Api::Unknown(_) => "unknown",
                }
            }

            /// The API with this exact name, if known.
            pub fn from_name(name: &str) -> Option<Api> {
                match name {
                    $($name => Some(Api::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

apis! {
    Allocator = 1 => "allocator",
    CudaMalloc = 2 => "cudaMalloc",
    CudaFree = 3 => "cudaFree",
    CudaMallocAsync = 4 => "cudaMallocAsync",
    CudaFreeAsync = 5 => "cudaFreeAsync",
    CudaMallocFromPoolAsync = 6 => "cudaMallocFromPoolAsync",
    CudaMallocManaged = 7 => "cudaMallocManaged",
    CudaMallocHost = 8 => "cudaMallocHost",
    CudaHostAlloc = 9 => "cudaHostAlloc",
    CudaFreeHost = 10 => "cudaFreeHost",
    CudaHostRegister = 11 => "cudaHostRegister",
    CudaHostUnregister = 12 => "cudaHostUnregister",
    CudaMemPoolTrimTo = 13 => "cudaMemPoolTrimTo",
    CudaIpcOpenMemHandle = 14 => "cudaIpcOpenMemHandle",
    CudaIpcCloseMemHandle = 15 => "cudaIpcCloseMemHandle",
    CudaMallocPitch = 16 => "cudaMallocPitch",
    CuMemAlloc_v2 = 32 => "cuMemAlloc_v2",
    CuMemFree_v2 = 33 => "cuMemFree_v2",
    CuMemAllocAsync = 34 => "cuMemAllocAsync",
    CuMemFreeAsync = 35 => "cuMemFreeAsync",
    CuMemAllocFromPoolAsync = 36 => "cuMemAllocFromPoolAsync",
    CuMemAllocManaged = 37 => "cuMemAllocManaged",
    CuMemAllocPitch_v2 = 38 => "cuMemAllocPitch_v2",
    CuMemHostAlloc = 39 => "cuMemHostAlloc",
    CuMemAllocHost_v2 = 40 => "cuMemAllocHost_v2",
    CuMemFreeHost = 41 => "cuMemFreeHost",
    CuMemHostRegister_v2 = 42 => "cuMemHostRegister_v2",
    CuMemHostUnregister = 43 => "cuMemHostUnregister",
    CuMemPoolTrimTo = 44 => "cuMemPoolTrimTo",
    CuIpcOpenMemHandle_v2 = 45 => "cuIpcOpenMemHandle_v2",
    CuIpcCloseMemHandle = 46 => "cuIpcCloseMemHandle",
    CuMemImportFromShareableHandle = 47 => "cuMemImportFromShareableHandle",
    CuMemAddressReserve = 48 => "cuMemAddressReserve",
    CuMemAddressFree = 49 => "cuMemAddressFree",
    CuMemCreate = 50 => "cuMemCreate",
    CuMemRelease = 51 => "cuMemRelease",
    CuMemMap = 52 => "cuMemMap",
    CuMemUnmap = 53 => "cuMemUnmap",
    CuMemSetAccess = 54 => "cuMemSetAccess",
    CuMemFreeAsync_ptsz = 55 => "cuMemFreeAsync_ptsz",
    CuMemAllocAsync_ptsz = 56 => "cuMemAllocAsync_ptsz",
    CuMemAllocFromPoolAsync_ptsz = 57 => "cuMemAllocFromPoolAsync_ptsz",
    CudaLaunchKernel = 96 => "cudaLaunchKernel",
    CudaLaunchKernel_ptsz = 97 => "cudaLaunchKernel_ptsz",
    __CudaLaunchKernel = 98 => "__cudaLaunchKernel",
    __CudaLaunchKernel_ptsz = 99 => "__cudaLaunchKernel_ptsz",
    CudaLaunchKernelExC = 100 => "cudaLaunchKernelExC",
    CudaLaunchKernelExC_ptsz = 101 => "cudaLaunchKernelExC_ptsz",
    CudaLaunchCooperativeKernel = 102 => "cudaLaunchCooperativeKernel",
    CudaLaunchCooperativeKernel_ptsz = 103 => "cudaLaunchCooperativeKernel_ptsz",
    CudaGraphLaunch = 104 => "cudaGraphLaunch",
    CudaGraphLaunch_ptsz = 105 => "cudaGraphLaunch_ptsz",
    CuLaunchKernel = 112 => "cuLaunchKernel",
    CuLaunchKernel_ptsz = 113 => "cuLaunchKernel_ptsz",
    CuLaunchKernelEx = 114 => "cuLaunchKernelEx",
    CuLaunchKernelEx_ptsz = 115 => "cuLaunchKernelEx_ptsz",
    CuLaunchCooperativeKernel = 116 => "cuLaunchCooperativeKernel",
    CuLaunchCooperativeKernel_ptsz = 117 => "cuLaunchCooperativeKernel_ptsz",
    CuGraphLaunch = 118 => "cuGraphLaunch",
    CuGraphLaunch_ptsz = 119 => "cuGraphLaunch_ptsz",
    Cupti = 160 => "cupti",
    Nvtx = 161 => "nvtx",
    User = 162 => "user",
    CudaMallocAsync_ptsz = 17 => "cudaMallocAsync_ptsz",
    CudaFreeAsync_ptsz = 18 => "cudaFreeAsync_ptsz",
    CudaMallocFromPoolAsync_ptsz = 19 => "cudaMallocFromPoolAsync_ptsz",
    CuArrayCreate_v2 = 58 => "cuArrayCreate_v2",
    CuArray3DCreate_v2 = 59 => "cuArray3DCreate_v2",
    CuMipmappedArrayCreate = 60 => "cuMipmappedArrayCreate",
    CuArrayDestroy = 61 => "cuArrayDestroy",
    CuMipmappedArrayDestroy = 62 => "cuMipmappedArrayDestroy",
    CuLaunch = 120 => "cuLaunch",
    CuLaunchGrid = 121 => "cuLaunchGrid",
    CuLaunchGridAsync = 122 => "cuLaunchGridAsync",
}

impl Api {
    /// An API a JSON Lines line names but this version does not know (a newer writer's): the line
    /// gives no code, so it is kept as code 0, which no API has (FORMAT.md §2). Its name is lost;
    /// written again, it is `unknown:0`.
    pub const UNKNOWN_NAME: Api = Api::Unknown(0);

    /// Whether this API launches kernels (graph launches included).
    pub fn is_launch(self) -> bool {
        (96..160).contains(&self.code())
    }

    /// Whether this is a graph launch (`cudaGraphLaunch`, `cuGraphLaunch` and `_ptsz`).
    pub fn is_graph_launch(self) -> bool {
        matches!(self, Api::CudaGraphLaunch | Api::CudaGraphLaunch_ptsz | Api::CuGraphLaunch | Api::CuGraphLaunch_ptsz)
    }
}

impl std::fmt::Display for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Api::Unknown(c) => write!(f, "unknown({c})"),
            a => f.write_str(a.name()),
        }
    }
}

impl Serialize for Api {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            // A newer producer's API survives a JSON round trip as its code.
            Api::Unknown(c) => s.serialize_str(&format!("unknown:{c}")),
            a => s.serialize_str(a.name()),
        }
    }
}

impl<'de> Deserialize<'de> for Api {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        if let Some(a) = Api::from_name(&s) {
            return Ok(a);
        }
        if let Some(code) = s.strip_prefix("unknown:").and_then(|c| c.parse::<u16>().ok()) {
            return Ok(Api::from_code(code));
        }
        // A name a newer writer knows, kept as the binary form keeps a code it does not know
        // (FORMAT.md §1.9 rule 3); readers say so. Entry points are C identifiers: anything else
        // is damage.
        let identifier = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if identifier {
            return Ok(Api::UNKNOWN_NAME);
        }
        Err(serde::de::Error::custom(format!(
            "api {s:?} is no entry-point name: expected a CUDA entry-point name (a C identifier) such as \
             \"cudaMalloc\" or \"allocator\", or unknown:<code> with a code up to 65535"
        )))
    }
}

impl Encode for Api {
    fn encode<E: Encoder>(&self, e: &mut E) -> Result<(), EncodeError> {
        self.code().encode(e)
    }
}

impl<C> Decode<C> for Api {
    fn decode<D: Decoder<Context = C>>(d: &mut D) -> Result<Self, DecodeError> {
        Ok(Api::from_code(u16::decode(d)?))
    }
}

bincode::impl_borrow_decode!(Api);
