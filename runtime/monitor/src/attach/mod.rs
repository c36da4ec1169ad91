//! The monitor's side of attach ([`server`]) and the frames both sides speak ([`wire`]).

pub mod server;
pub mod wire;
