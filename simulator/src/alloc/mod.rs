//! The caching-allocator model (sans-IO).
