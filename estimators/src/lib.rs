//! memest library (skeleton).
