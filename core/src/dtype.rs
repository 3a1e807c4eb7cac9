//! Datatypes and reduction operations, with NCCL's numbering.

use crate::error::{Error, Result};

/// NCCL's `ncclDataType_t`, same values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum DataType {
    Int8 = 0,
    Uint8 = 1,
    Int32 = 2,
    Uint32 = 3,
    Int64 = 4,
    Uint64 = 5,
    Float16 = 6,
    Float32 = 7,
    Float64 = 8,
    Bfloat16 = 9,
    Float8e4m3 = 10,
    Float8e5m2 = 11,
}

impl DataType {
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ];

    pub fn from_raw(v: i32) -> Result<DataType> {
        DataType::ALL
            .get(usize::try_from(v).unwrap_or(usize::MAX))
            .copied()
            .ok_or_else(|| {
                Error::InvalidArgument(format!("datatype {v} is not an ncclDataType_t (0..=11)"))
            })
    }

    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8e4m3 | DataType::Float8e5m2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// The name nccl-tests prints.
    pub fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Bfloat16 => "bfloat16",
            DataType::Float8e4m3 => "f8e4m3",
            DataType::Float8e5m2 => "f8e5m2",
        }
    }

    /// Accepts nccl-tests' names and a few aliases.
    pub fn parse(s: &str) -> Result<DataType> {
        let t = match s.to_ascii_lowercase().as_str() {
            "int8" | "char" => DataType::Int8,
            "uint8" => DataType::Uint8,
            "int32" | "int" => DataType::Int32,
            "uint32" => DataType::Uint32,
            "int64" => DataType::Int64,
            "uint64" => DataType::Uint64,
            "half" | "float16" | "fp16" => DataType::Float16,
            "float" | "float32" | "fp32" => DataType::Float32,
            "double" | "float64" | "fp64" => DataType::Float64,
            "bfloat16" | "bf16" => DataType::Bfloat16,
            "f8e4m3" | "fp8_e4m3" | "float8e4m3" | "e4m3" => DataType::Float8e4m3,
            "f8e5m2" | "fp8_e5m2" | "float8e5m2" | "e5m2" => DataType::Float8e5m2,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "unknown datatype {s:?}: expected one of {}",
                    DataType::ALL.map(|d| d.name()).join(", ")
                )))
            }
        };
        Ok(t)
    }

    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Float16
                | DataType::Float32
                | DataType::Float64
                | DataType::Bfloat16
                | DataType::Float8e4m3
                | DataType::Float8e5m2
        )
    }
}

/// A reduction operation (NCCL's `ncclRedOp_t` plus the scalar of a
/// pre-multiplied sum, which NCCL keeps behind a dynamic op handle).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RedOp {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
    /// Each rank's input is multiplied by the scalar before summing
    /// (`ncclRedOpCreatePreMulSum`).
    PreMulSum(f64),
}

impl RedOp {
    /// Every op, the pre-multiplied sum with the scalar 2 (exact in every type).
    pub const ALL: [RedOp; 6] = [
        RedOp::Sum,
        RedOp::Prod,
        RedOp::Max,
        RedOp::Min,
        RedOp::Avg,
        RedOp::PreMulSum(2.0),
    ];

    /// NCCL's value for the built-in ops; `PreMulSum` has none of its own.
    pub fn from_raw(v: i32) -> Result<RedOp> {
        Ok(match v {
            0 => RedOp::Sum,
            1 => RedOp::Prod,
            2 => RedOp::Max,
            3 => RedOp::Min,
            4 => RedOp::Avg,
            _ => return Err(Error::InvalidArgument(format!("reduction op {v} is not an ncclRedOp_t (0..=4) nor one created by ncclRedOpCreatePreMulSum"))),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
            RedOp::PreMulSum(_) => "premulsum",
        }
    }

    /// Accepts nccl-tests' names; `premulsum` takes the scalar 2 (exact in
    /// every type, integers included) unless given as `premulsum:<scalar>`.
    pub fn parse(s: &str) -> Result<RedOp> {
        let lower = s.to_ascii_lowercase();
        if let Some(rest) = lower.strip_prefix("premulsum") {
            let scalar = match rest.strip_prefix(':') {
                Some(v) => v.parse().map_err(|_| {
                    Error::InvalidArgument(format!("premulsum scalar {v:?} is not a number"))
                })?,
                None => 2.0,
            };
            return Ok(RedOp::PreMulSum(scalar));
        }
        Ok(match lower.as_str() {
            "sum" => RedOp::Sum,
            "prod" => RedOp::Prod,
            "max" => RedOp::Max,
            "min" => RedOp::Min,
            "avg" => RedOp::Avg,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "unknown reduction op {s:?}: expected sum, prod, max, min, avg or premulsum"
                )))
            }
        })
    }
}
