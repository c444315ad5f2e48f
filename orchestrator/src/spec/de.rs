//! serde's `Deserializer` over the located YAML tree: the spec's types read straight from
//! the nodes, so an error carries the location of the node it is about, and what serde
//! reports (an unknown key and the keys it expected, a missing key, a wrong type) stays a
//! value instead of becoming a message to take apart again.
//!
//! Scalars are read as YAML 1.2's core schema types them (`true`, `~`, `0x10`, `1.0e-3`);
//! a string field takes the text as written, whatever it looks like.

use super::yaml::Location;
use saphyr::{MarkedYaml, Scalar, ScalarStyle, YamlData};
use serde::de::{
    self, DeserializeSeed, Expected, IntoDeserializer, MapAccess, SeqAccess, Unexpected, Visitor,
};
use std::fmt;

/// What went wrong, as serde said it.
#[derive(Debug, Clone, PartialEq)]
pub enum Problem {
    UnknownKey {
        key: String,
        expected: &'static [&'static str],
    },
    UnknownValue {
        value: String,
        expected: &'static [&'static str],
    },
    MissingKey(&'static str),
    /// A value of the wrong type or out of range: serde's message and what it expected, in
    /// the spec's words ([`in_words`]).
    WrongValue {
        message: String,
        expected: String,
        /// The scalar found, to find where it is written when serde gives no node.
        found: Option<BadScalar>,
    },
    Other(String),
}

/// A scalar value serde found wrong.
#[derive(Debug, Clone, PartialEq)]
pub enum BadScalar {
    /// A string: its text.
    Str(String),
    /// A boolean or a whole number, as YAML writes it.
    Plain(String),
    Float(f64),
}

impl BadScalar {
    fn of(unexp: &Unexpected<'_>) -> Option<BadScalar> {
        Some(match unexp {
            Unexpected::Str(s) => BadScalar::Str(s.to_string()),
            Unexpected::Char(c) => BadScalar::Str(c.to_string()),
            Unexpected::Bool(b) => BadScalar::Plain(b.to_string()),
            Unexpected::Unsigned(n) => BadScalar::Plain(n.to_string()),
            Unexpected::Signed(n) => BadScalar::Plain(n.to_string()),
            Unexpected::Float(x) => BadScalar::Float(*x),
            _ => return None,
        })
    }

    /// Whether scalar node `node` holds this value: `2` is the number, `"2"` the string.
    pub fn is_in(&self, node: &MarkedYaml<'_>) -> bool {
        let YamlData::Representation(text, style, tag) = &node.data else {
            return false;
        };
        let typed = Scalar::parse_from_cow_and_metadata(text.clone(), *style, tag.as_ref());
        match (self, typed) {
            (BadScalar::Str(s), Some(Scalar::String(t))) => *s == *t,
            (BadScalar::Plain(s), Some(Scalar::Boolean(_) | Scalar::Integer(_))) => s == text,
            (BadScalar::Float(x), Some(Scalar::FloatingPoint(y))) => *x == *y,
            _ => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeError {
    pub problem: Problem,
    /// The innermost node the error came out of; `None` when serde found it in a value it
    /// had buffered (internally tagged enums such as `model: {kind: ...}`), where only the
    /// path says where it is.
    pub at: Option<Location>,
    /// Whether an enclosing node may still claim the error: not once it has left the value
    /// it was found in without a node of its own.
    open: bool,
}

impl DeError {
    fn new(problem: Problem) -> DeError {
        DeError {
            problem,
            at: None,
            open: true,
        }
    }

    /// The error has left the value it is about.
    fn close(mut self) -> DeError {
        self.open = false;
        self
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.problem {
            Problem::UnknownKey { key, .. } => write!(f, "unknown field `{key}`"),
            Problem::UnknownValue { value, .. } => write!(f, "unknown variant `{value}`"),
            Problem::MissingKey(key) => write!(f, "missing field `{key}`"),
            Problem::WrongValue { message, .. } | Problem::Other(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError::new(Problem::Other(msg.to_string()))
    }

    fn invalid_type(unexp: Unexpected<'_>, exp: &dyn Expected) -> Self {
        let expected = in_words(&exp.to_string());
        DeError::new(Problem::WrongValue {
            message: format!(
                "invalid type: {}, expected {expected}",
                found_in_words(&unexp)
            ),
            expected,
            found: BadScalar::of(&unexp),
        })
    }

    fn invalid_value(unexp: Unexpected<'_>, exp: &dyn Expected) -> Self {
        let expected = in_words(&exp.to_string());
        DeError::new(Problem::WrongValue {
            message: format!("invalid value: {unexp}, expected {expected}"),
            expected,
            found: BadScalar::of(&unexp),
        })
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        DeError::new(Problem::UnknownValue {
            value: variant.to_string(),
            expected,
        })
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        DeError::new(Problem::UnknownKey {
            key: field.to_string(),
            expected,
        })
    }

    fn missing_field(field: &'static str) -> Self {
        DeError::new(Problem::MissingKey(field))
    }
}

/// What was written, in the spec's words where serde's are Rust's: `key:` with nothing after
/// it (or `null`, `~`) is no value, not a "unit value"; a whole number past any integer
/// (which YAML then reads as a float) is too large or too far below zero, not a float.
fn found_in_words(unexp: &Unexpected<'_>) -> String {
    // 2^64: from here on no integer holds a number written without a point.
    let past_integers = 18_446_744_073_709_551_616.0;
    match unexp {
        Unexpected::Unit => "no value (nothing, or null, after the key)".to_string(),
        Unexpected::Float(x) if x.fract() == 0.0 && *x >= past_integers => {
            format!("a whole number larger than {}", u64::MAX)
        }
        Unexpected::Float(x) if x.fract() == 0.0 && *x < i64::MIN as f64 => {
            "a whole number far below zero".to_string()
        }
        other => other.to_string(),
    }
}

/// What serde expected, in the spec's words rather than the Rust type's name: the spec's
/// sections are mappings, and its models and wrap policies mappings that name their `kind`.
fn in_words(expected: &str) -> String {
    if let Some(name) = expected.strip_prefix("internally tagged enum ") {
        let kinds = match name {
            "ModelSpec" => " (`{kind: llama, ...}`; kinds: transformer, mlp, llama, hf)",
            "WrapPolicy" => " (`{kind: block}`; kinds: block, size_based, module_names)",
            _ => "",
        };
        return format!("a mapping that names its `kind`{kinds}");
    }
    if expected.starts_with("struct ") {
        return "a mapping of keys (`key: value` lines)".into();
    }
    match expected {
        "u64" | "u32" | "usize" => "a whole number (0 or more)".into(),
        "f64" => "a number".into(),
        "a boolean" | "bool" => "true or false".into(),
        other => other.to_string(),
    }
}

/// Deserializes the value a node holds.
pub struct Node<'n, 'a>(pub &'n MarkedYaml<'a>);

impl Node<'_, '_> {
    /// The first node an error comes out of is the one it is about.
    fn locate<T>(&self, result: Result<T, DeError>) -> Result<T, DeError> {
        result.map_err(|mut e| {
            if e.at.is_none() && e.open {
                e.at = Location::of(&self.0.span);
            }
            e
        })
    }

    /// Plain `~`, `null` or nothing: YAML's null (a quoted `"null"` is a string).
    fn is_null(&self) -> bool {
        match &self.0.data {
            YamlData::Representation(text, ScalarStyle::Plain, tag) => {
                tag.as_ref()
                    .is_none_or(|t| t.is_yaml_core_schema() && t.suffix == "null")
                    && matches!(text.as_ref(), "" | "~" | "null" | "Null" | "NULL")
            }
            YamlData::BadValue => true,
            _ => false,
        }
    }

    fn visit_any<'de, V: Visitor<'de>>(&self, visitor: V) -> Result<V::Value, DeError> {
        match &self.0.data {
            YamlData::Representation(text, style, tag) => {
                match Scalar::parse_from_cow_and_metadata(text.clone(), *style, tag.as_ref()) {
                    Some(Scalar::Null) => visitor.visit_unit(),
                    Some(Scalar::Boolean(b)) => visitor.visit_bool(b),
                    Some(Scalar::Integer(i)) => match u64::try_from(i) {
                        Ok(u) => visitor.visit_u64(u),
                        Err(_) => visitor.visit_i64(i),
                    },
                    // Whole numbers past i64 (up to u64's largest) are YAML floats.
                    Some(Scalar::FloatingPoint(f)) => match text.parse::<u64>() {
                        Ok(u) => visitor.visit_u64(u),
                        Err(_) => visitor.visit_f64(f.into_inner()),
                    },
                    Some(Scalar::String(s)) => visitor.visit_str(&s),
                    None => Err(de::Error::custom(format!(
                        "`{text}` is not a value of its tag `{}`",
                        tag.as_ref().map(|t| t.to_string()).unwrap_or_default()
                    ))),
                }
            }
            YamlData::Sequence(items) => visitor.visit_seq(Items(items.iter())),
            YamlData::Mapping(map) => visitor.visit_map(Entries {
                entries: map.iter(),
                value: None,
            }),
            YamlData::BadValue => visitor.visit_unit(),
            // Refused when the document is parsed, and resolved by the loader.
            YamlData::Value(_) | YamlData::Tagged(..) | YamlData::Alias(_) => {
                Err(de::Error::custom("this value is not read in a job spec"))
            }
        }
    }
}

impl<'de> de::Deserializer<'de> for Node<'_, '_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let result = self.visit_any(visitor);
        self.locate(result)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let result = match &self.0.data {
            YamlData::Representation(text, _, _) => visitor.visit_str(text),
            _ => self.visit_any(visitor),
        };
        self.locate(result)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let result = if self.is_null() {
            visitor.visit_none()
        } else {
            visitor.visit_some(Node(self.0))
        };
        self.locate(result)
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let result = if self.is_null() {
            visitor.visit_unit()
        } else {
            self.visit_any(visitor)
        };
        self.locate(result)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let result = visitor.visit_newtype_struct(Node(self.0));
        self.locate(result)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        // Null reads as an empty list, as if the key were not written.
        let result = if self.is_null() {
            visitor.visit_seq(Items([].iter()))
        } else {
            self.visit_any(visitor)
        };
        self.locate(result)
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        // Null reads as an empty section, as if the key were not written: `resources:` with
        // nothing under it, `schedule: ~`, `--set training.fsdp.mixed_precision=null`
        // (PyTorch's `mixed_precision=None`: its defaults).
        let result = if self.is_null() {
            visitor.visit_map(Entries {
                entries: std::iter::empty::<(&MarkedYaml, &MarkedYaml)>(),
                value: None,
            })
        } else {
            self.visit_any(visitor)
        };
        self.locate(result)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        // serde would read a list into the fields in their order: a spec's sections are
        // mappings.
        if let YamlData::Sequence(_) = &self.0.data {
            let refused = Err(de::Error::invalid_type(Unexpected::Seq, &visitor));
            return self.locate(refused);
        }
        self.deserialize_map(visitor)
    }

    /// Enums of the spec are written as their variant's name (`strategy: FULL_SHARD`).
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let result = match &self.0.data {
            YamlData::Representation(text, _, _) => {
                visitor.visit_enum(text.as_ref().into_deserializer())
            }
            _ => self.visit_any(visitor),
        };
        self.locate(result)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 bytes byte_buf
    }
}

struct Items<'n, 'a>(std::slice::Iter<'n, MarkedYaml<'a>>);

impl<'de> SeqAccess<'de> for Items<'_, '_> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        self.0
            .next()
            .map(|item| seed.deserialize(Node(item)).map_err(DeError::close))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Entries<'n, 'a, I> {
    entries: I,
    value: Option<&'n MarkedYaml<'a>>,
}

impl<'de, 'n, 'a, I> MapAccess<'de> for Entries<'n, 'a, I>
where
    I: ExactSizeIterator<Item = (&'n MarkedYaml<'a>, &'n MarkedYaml<'a>)>,
    'a: 'n,
{
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some(value);
        seed.deserialize(Node(key)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let value = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a value was read before its key"))?;
        seed.deserialize(Node(value)).map_err(DeError::close)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}
