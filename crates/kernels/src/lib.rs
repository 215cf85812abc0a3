//! CPU kernels of the deepring engine (`engine/deepring/kernels`) that torch has no fast form of
//! on every x86 CPU. They are bound into `deepring_recipe._native` as private names (the engine
//! already loads that module); nothing in the recipe API depends on them.

pub mod int8_head;
pub mod parts;
