//! The figures `shardrun plot` draws, as SVG or PNG: one run ([`run::RunFigure`]) or a
//! sweep folder ([`sweep::SweepFigure`]). [`series`] holds the arithmetic (smoothing,
//! ranges, ticks, clipping), [`canvas`] the drawing of panels with plotters.

pub mod canvas;
pub mod run;
pub mod series;
pub mod sweep;

pub use canvas::{check_format, save};
