//! libmemtrace.so (skeleton; see issue 3).
