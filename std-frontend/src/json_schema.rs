//! Output constrained to a JSON Schema (OpenAI's `response_format: {"type": "json_schema"}`,
//! `generate --json-schema`): the subset that structured-output clients send (pydantic's and
//! zod's schemas), compiled to a table of nodes, and a pushdown automaton over bytes whose state
//! is a `Copy` value, as `JsonPrefix` is for any object.
//!
//! Objects hold their schema's properties in any order, each at most once, the required ones
//! always, and no others, so `additionalProperties` only ever narrows; `anyOf`/`oneOf` and
//! lists of types need branches that begin with different bytes (`Optional[X]` is `X` or
//! `null`), so the first byte picks the branch, or objects that a property tells apart (each
//! requires it with a `const` of its own), written first, so that its value picks the branch. A keyword that would constrain the output in a
//! way the automaton does not check (`pattern`, `format`, `minimum`, ...) is an error naming it,
//! never ignored.
use std::collections::HashMap;

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

use crate::constraint::Automaton;
use crate::json_lex::{Number, Step, Str, Word};
use crate::json_output::{JsonPrefix, MAX_SPACES};

/// Containers open at once.
const MAX_DEPTH: usize = 16;
/// Properties of one object, and values of one `enum` (one bit each).
const MAX_CHOICES: usize = 64;
/// Nodes of a compiled schema: bounds the work of compiling a hostile one.
const MAX_NODES: usize = 2048;

/// A set of bytes, one bit each.
type ByteSet = [u64; 4];

fn has(set: &ByteSet, b: u8) -> bool {
    set[b as usize / 64] >> (b % 64) & 1 == 1
}

type NodeId = u16;

#[derive(Debug)]
enum Node {
    /// Any JSON value; any object when `object`.
    Any {
        object: bool,
    },
    Null,
    Boolean,
    Number {
        integer: bool,
    },
    String,
    /// One of these values, each as compact JSON text.
    Enum(Vec<Vec<u8>>),
    Array {
        items: NodeId,
        min: u32,
        max: u32,
    },
    /// Properties in order: the key as JSON string content (escaped), its value's node; and
    /// how many of them it has at least and at most (`minProperties`, `maxProperties`).
    Object {
        properties: Vec<(Vec<u8>, NodeId)>,
        required: u64,
        fewest: u8,
        most: u8,
    },
    /// An object of any keys whose values are of one node (`additionalProperties` a schema,
    /// no `properties`: a dictionary).
    Map {
        values: NodeId,
    },
    /// The branch whose `starts` has the value's first byte.
    AnyOf(Vec<NodeId>),
    /// Objects of several shapes (`Object` nodes), told apart by property `key` (escaped),
    /// which each requires with one value of its own (`const`): the key comes first, and its
    /// value (of the `Enum` node `tags`, value `i` for branch `i`) picks the branch.
    Union {
        key: Vec<u8>,
        tags: NodeId,
        branches: Vec<NodeId>,
    },
}

/// A compiled schema: node 0 is the root, an object.
#[derive(Debug)]
pub struct Schema {
    nodes: Vec<Node>,
    /// The bytes a value of each node can begin with.
    starts: Vec<ByteSet>,
}

/// Keywords that say nothing about the output's text.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "$defs",
    "definitions",
    "strict",
    // OpenAPI's name of a union's telling property: unions are told apart by it anyway.
    "discriminator",
];

impl Schema {
    /// Compiles `schema` (the `schema` of a `json_schema` response format).
    ///
    /// # Errors
    /// A keyword outside the supported subset, a `$ref` that does not resolve, branches that
    /// begin alike, a root that is not an object, more than 64 properties or `enum` values.
    pub fn compile(schema: &Value) -> Result<Schema> {
        let mut c = Compiler {
            root: schema,
            nodes: Vec::new(),
            refs: HashMap::new(),
        };
        c.node(schema, 0)?;
        let mut s = Schema {
            nodes: c.nodes,
            starts: Vec::new(),
        };
        if !matches!(
            s.nodes[0],
            Node::Object { .. }
                | Node::Map { .. }
                | Node::Any { object: true }
                | Node::Union { .. }
        ) {
            bail!("a json_schema's root must be an object (\"type\": \"object\")");
        }
        s.starts = s.first_bytes()?;
        Ok(s)
    }

    /// Each node's first bytes, to the fixed point (a `$ref` may point back): at most one
    /// round per node, as a branch's set reaches its `anyOf` in one.
    fn first_bytes(&self) -> Result<Vec<ByteSet>> {
        let mut starts = vec![[0u64; 4]; self.nodes.len()];
        let mut changed = true;
        while changed {
            changed = false;
            for (i, n) in self.nodes.iter().enumerate() {
                let mut set = starts[i];
                let mut add = |bytes: &[u8]| {
                    for &b in bytes {
                        set[b as usize / 64] |= 1 << (b % 64);
                    }
                };
                match n {
                    Node::Any { object: true }
                    | Node::Object { .. }
                    | Node::Map { .. }
                    | Node::Union { .. } => add(b"{"),
                    Node::Any { object: false } => add(b"{[\"-0123456789tfn"),
                    Node::Null => add(b"n"),
                    Node::Boolean => add(b"tf"),
                    Node::Number { .. } => add(b"-0123456789"),
                    Node::String => add(b"\""),
                    Node::Array { .. } => add(b"["),
                    Node::Enum(values) => values.iter().for_each(|v| add(&v[..1])),
                    Node::AnyOf(branches) => {
                        for &br in branches {
                            for (s, o) in set.iter_mut().zip(starts[br as usize]) {
                                *s |= o;
                            }
                        }
                    }
                }
                if set != starts[i] {
                    starts[i] = set;
                    changed = true;
                }
            }
        }
        for n in &self.nodes {
            if let Node::AnyOf(branches) = n {
                let mut seen: ByteSet = [0; 4];
                for &br in branches {
                    let set = &starts[br as usize];
                    if let Some(b) = (0..=255u8).find(|&b| has(set, b) && has(&seen, b)) {
                        bail!(
                            "json_schema: anyOf/oneOf branches (or a list of types) that can \
                             begin with the same byte {:?} are not supported; the branches must \
                             be of different JSON types",
                            b as char
                        );
                    }
                    for (s, o) in seen.iter_mut().zip(set) {
                        *s |= o;
                    }
                }
            }
        }
        Ok(starts)
    }

    /// The automaton at the start of a value of this schema.
    pub fn start(&self) -> SchemaPrefix {
        SchemaPrefix {
            frames: [Frame::default(); MAX_DEPTH],
            depth: 0,
            spaces: 0,
            lex: Lex::Value(0),
        }
    }
}

struct Compiler<'v> {
    root: &'v Value,
    nodes: Vec<Node>,
    /// `$ref` targets already given a node (recursive schemas point back to them).
    refs: HashMap<String, NodeId>,
}

impl<'v> Compiler<'v> {
    fn push(&mut self, node: Node) -> Result<NodeId> {
        if self.nodes.len() == MAX_NODES {
            bail!("json_schema: more than {MAX_NODES} schemas in one is not supported");
        }
        self.nodes.push(node);
        Ok((self.nodes.len() - 1) as NodeId)
    }

    fn node(&mut self, schema: &Value, depth: usize) -> Result<NodeId> {
        if depth > 64 {
            bail!("json_schema: nested more than 64 levels");
        }
        let obj = match schema {
            Value::Bool(true) => return self.push(Node::Any { object: false }),
            Value::Object(o) => o,
            _ => bail!("json_schema: a schema must be an object or true, not {schema}"),
        };
        if let Some(r) = obj.get("$ref") {
            return self.reference(r, depth);
        }
        for key in obj.keys() {
            let known = ANNOTATIONS.contains(&key.as_str())
                || matches!(
                    key.as_str(),
                    "type"
                        | "properties"
                        | "required"
                        | "additionalProperties"
                        | "items"
                        | "minItems"
                        | "maxItems"
                        | "minProperties"
                        | "maxProperties"
                        | "enum"
                        | "const"
                        | "anyOf"
                        | "oneOf"
                );
            if !known {
                bail!("json_schema keyword {key:?} is not supported");
            }
        }
        if let Some(v) = obj.get("const") {
            return self.enumeration(std::slice::from_ref(v));
        }
        if let Some(v) = obj.get("enum") {
            let values = v
                .as_array()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| anyhow!("json_schema: enum must be a non-empty array"))?;
            return self.enumeration(values);
        }
        if let Some(branches) = obj.get("anyOf").or(obj.get("oneOf")) {
            let branches = branches
                .as_array()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| anyhow!("json_schema: anyOf/oneOf must be a non-empty array"))?;
            let id = self.push(Node::AnyOf(Vec::new()))?;
            let ids = branches
                .iter()
                .map(|b| self.node(b, depth + 1))
                .collect::<Result<Vec<_>>>()?;
            self.nodes[id as usize] = match self.union(&ids)? {
                Some(union) => union,
                None => Node::AnyOf(ids),
            };
            return Ok(id);
        }
        match obj.get("type") {
            None => self.push(Node::Any { object: false }),
            Some(Value::String(t)) => self.typed(obj, t, depth),
            Some(Value::Array(types)) => {
                let id = self.push(Node::AnyOf(Vec::new()))?;
                let ids = types
                    .iter()
                    .map(|t| match t.as_str() {
                        Some(t) => self.typed(obj, t, depth),
                        None => bail!("json_schema: a type list must hold type names"),
                    })
                    .collect::<Result<Vec<_>>>()?;
                self.nodes[id as usize] = Node::AnyOf(ids);
                Ok(id)
            }
            Some(t) => bail!("json_schema: type must be a name or a list of names, not {t}"),
        }
    }

    /// The node behind `$ref` wrappers.
    fn resolved(&self, mut id: NodeId) -> NodeId {
        for _ in 0..self.nodes.len() {
            match &self.nodes[id as usize] {
                Node::AnyOf(inner) if inner.len() == 1 => id = inner[0],
                _ => break,
            }
        }
        id
    }

    /// `branches` as a `Union`, where they are objects that one property tells apart: each
    /// requires it with a value of its own (pydantic's discriminated unions, OpenAI's tool
    /// calls by name). `None` where they are not.
    fn union(&mut self, branches: &[NodeId]) -> Result<Option<Node>> {
        if !(2..=MAX_CHOICES).contains(&branches.len()) {
            return Ok(None);
        }
        let objects: Vec<NodeId> = branches.iter().map(|&b| self.resolved(b)).collect();
        let Some(Node::Object {
            properties: first, ..
        }) = self.nodes.get(objects[0] as usize)
        else {
            return Ok(None);
        };
        'keys: for (key, _) in first.clone() {
            let mut tags: Vec<Vec<u8>> = Vec::with_capacity(objects.len());
            for &o in &objects {
                let Node::Object {
                    properties,
                    required,
                    ..
                } = &self.nodes[o as usize]
                else {
                    return Ok(None);
                };
                let Some(k) = properties.iter().position(|(name, _)| *name == key) else {
                    continue 'keys;
                };
                let value = &self.nodes[self.resolved(properties[k].1) as usize];
                match value {
                    Node::Enum(values)
                        if required >> k & 1 == 1
                            && values.len() == 1
                            && !tags.contains(&values[0]) =>
                    {
                        tags.push(values[0].clone())
                    }
                    _ => continue 'keys,
                }
            }
            let tags = self.push(Node::Enum(tags))?;
            return Ok(Some(Node::Union {
                key,
                tags,
                branches: objects,
            }));
        }
        Ok(None)
    }

    fn reference(&mut self, r: &Value, depth: usize) -> Result<NodeId> {
        let r = r
            .as_str()
            .ok_or_else(|| anyhow!("json_schema: $ref must be a string"))?;
        if let Some(&id) = self.refs.get(r) {
            return Ok(id);
        }
        let target = r
            .strip_prefix('#')
            .and_then(|p| self.root.pointer(p))
            .ok_or_else(|| {
                anyhow!("json_schema: $ref {r:?} does not point into this schema (#/$defs/...)")
            })?;
        // The node is reserved first, so a reference back to it resolves.
        let id = self.push(Node::AnyOf(Vec::new()))?;
        self.refs.insert(r.to_owned(), id);
        let inner = self.node(target, depth + 1)?;
        self.nodes[id as usize] = Node::AnyOf(vec![inner]);
        Ok(id)
    }

    fn enumeration(&mut self, values: &[Value]) -> Result<NodeId> {
        if values.len() > MAX_CHOICES {
            bail!("json_schema: an enum of more than {MAX_CHOICES} values is not supported");
        }
        let texts = values
            .iter()
            .map(|v| serde_json::to_vec(v).map_err(|e| anyhow!("json_schema: enum value: {e}")))
            .collect::<Result<Vec<_>>>()?;
        self.push(Node::Enum(texts))
    }

    fn count(obj: &serde_json::Map<String, Value>, key: &str, default: u32) -> Result<u32> {
        match obj.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .map(|n| n.min(u64::from(u32::MAX)) as u32)
                .ok_or_else(|| anyhow!("json_schema: {key} must be a whole number")),
        }
    }

    fn typed(
        &mut self,
        obj: &serde_json::Map<String, Value>,
        t: &str,
        depth: usize,
    ) -> Result<NodeId> {
        match t {
            "null" => self.push(Node::Null),
            "boolean" => self.push(Node::Boolean),
            "integer" => self.push(Node::Number { integer: true }),
            "number" => self.push(Node::Number { integer: false }),
            "string" => self.push(Node::String),
            "array" => {
                let (min, max) = (
                    Self::count(obj, "minItems", 0)?,
                    Self::count(obj, "maxItems", u32::MAX)?,
                );
                if min > max {
                    bail!("json_schema: minItems {min} is more than maxItems {max}");
                }
                let id = self.push(Node::Any { object: false })?;
                let items = match obj.get("items") {
                    None => self.push(Node::Any { object: false })?,
                    Some(items) => self.node(items, depth + 1)?,
                };
                self.nodes[id as usize] = Node::Array { items, min, max };
                Ok(id)
            }
            "object" => self.object(obj, depth),
            other => bail!("json_schema: unknown type {other:?}"),
        }
    }

    fn object(&mut self, obj: &serde_json::Map<String, Value>, depth: usize) -> Result<NodeId> {
        let counted = ["minProperties", "maxProperties"]
            .into_iter()
            .find(|k| obj.contains_key(*k));
        if let (Some(key), None) = (counted, obj.get("properties")) {
            bail!("json_schema: {key} is supported on objects of listed properties only");
        }
        let props = match (obj.get("properties"), obj.get("additionalProperties")) {
            (Some(props), _) => props,
            // No properties: any keys, with values of the additional properties' schema.
            (None, None | Some(Value::Bool(true))) if !obj.contains_key("required") => {
                return self.push(Node::Any { object: true });
            }
            (None, Some(values @ Value::Object(_))) if !obj.contains_key("required") => {
                let id = self.push(Node::Any { object: true })?;
                let values = self.node(values, depth + 1)?;
                self.nodes[id as usize] = Node::Map { values };
                return Ok(id);
            }
            // No properties and no others (`{}`), or `required` names to check.
            (None, _) => {
                return self.properties(&serde_json::Map::new(), obj, depth);
            }
        };
        let props = props
            .as_object()
            .ok_or_else(|| anyhow!("json_schema: properties must be an object"))?;
        self.properties(props, obj, depth)
    }

    /// An object of these properties (`required` read from `obj`) and no others.
    fn properties(
        &mut self,
        props: &serde_json::Map<String, Value>,
        obj: &serde_json::Map<String, Value>,
        depth: usize,
    ) -> Result<NodeId> {
        if props.len() > MAX_CHOICES {
            bail!("json_schema: an object of more than {MAX_CHOICES} properties is not supported");
        }
        let required: Vec<&str> = match obj.get("required") {
            None => Vec::new(),
            Some(Value::Array(names)) => names
                .iter()
                .map(|n| {
                    n.as_str()
                        .ok_or_else(|| anyhow!("json_schema: required must list property names"))
                })
                .collect::<Result<_>>()?,
            Some(_) => bail!("json_schema: required must be an array"),
        };
        for name in &required {
            if !props.contains_key(*name) {
                bail!("json_schema: required property {name:?} is not among the properties");
            }
        }
        let fewest = Self::count(obj, "minProperties", 0)?;
        let most = Self::count(obj, "maxProperties", u32::MAX)?.min(props.len() as u32);
        if fewest > most || (required.len() as u32) > most {
            bail!(
                "json_schema: no object has {fewest} to {most} of these {} properties with the \
                 {} required ones",
                props.len(),
                required.len()
            );
        }
        let id = self.push(Node::Any { object: true })?;
        let mut properties = Vec::with_capacity(props.len());
        let mut required_bits = 0u64;
        for (i, (name, schema)) in props.iter().enumerate() {
            let quoted = serde_json::to_vec(&Value::String(name.clone()))?;
            let key = quoted[1..quoted.len() - 1].to_vec();
            if key.len() > usize::from(u8::MAX) {
                bail!("json_schema: property names over 255 bytes are not supported");
            }
            properties.push((key, self.node(schema, depth + 1)?));
            if required.contains(&name.as_str()) {
                required_bits |= 1 << i;
            }
        }
        self.nodes[id as usize] = Node::Object {
            properties,
            required: required_bits,
            // Both at most `props.len()`, which is at most `MAX_CHOICES`.
            fewest: fewest as u8,
            most: most as u8,
        };
        Ok(id)
    }
}

/// An open container and where it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Frame {
    node: NodeId,
    /// Objects: the properties given so far, one bit each. Arrays: the values so far.
    progress: u64,
}

/// What the automaton reads at the innermost point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lex {
    /// Where a value of this node goes.
    Value(NodeId),
    /// After `[`: a value, or `]` where the array may be empty.
    ArrayFirst,
    /// Where a key goes (or `}` when `close` and no required property is left).
    Key { close: bool },
    /// Inside a key: bytes matched, and the properties it may still be.
    KeyText { len: u8, candidates: u64 },
    /// After a key: `:`, then the value of property `prop`.
    Colon { prop: u8 },
    /// After a value in a container: `,` or its closer.
    Next,
    /// Inside a string: a value, or a dictionary's key when `key`.
    Str { key: bool, lex: Str },
    /// After a dictionary's key: `:`, then a value of its values' node.
    MapColon,
    /// Inside a number (an integer: no fraction, no exponent).
    Number { integer: bool, part: Number },
    /// Inside `true`, `false` or `null`.
    Word(Word),
    /// Inside one of an enum's values: bytes matched, the values it may still be.
    EnumText {
        node: NodeId,
        len: u16,
        candidates: u64,
    },
    /// At the start of a union's object: `len` bytes of `"key":` matched.
    UnionKey { len: u16 },
    /// Inside a value of any content.
    Free(JsonPrefix),
    /// The root object is closed.
    Done,
}

/// A prefix of a JSON value of a schema, as the automaton's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaPrefix {
    frames: [Frame; MAX_DEPTH],
    depth: u8,
    spaces: u8,
    lex: Lex,
}

impl Automaton for SchemaPrefix {
    type Rules = Schema;

    fn step(&self, schema: &Schema, b: u8) -> Option<Self> {
        self.advance(schema, b)
    }

    fn is_complete(&self) -> bool {
        self.lex == Lex::Done
    }
}

impl SchemaPrefix {
    fn with(self, lex: Lex) -> Option<Self> {
        Some(SchemaPrefix {
            lex,
            spaces: 0,
            ..self
        })
    }

    fn top(&self) -> Option<Frame> {
        self.depth.checked_sub(1).map(|d| self.frames[d as usize])
    }

    fn set_top(&mut self, f: Frame) {
        self.frames[self.depth as usize - 1] = f;
    }

    fn open(self, node: NodeId, lex: Lex) -> Option<Self> {
        if self.depth as usize == MAX_DEPTH {
            return None;
        }
        let mut s = self;
        s.frames[s.depth as usize] = Frame { node, progress: 0 };
        s.depth += 1;
        s.with(lex)
    }

    /// A value just ended: the root closes, an array counts it, a union's key picks its
    /// branch.
    fn value_done(self, schema: &Schema) -> Option<Self> {
        let Some(mut top) = self.top() else {
            return self.with(Lex::Done);
        };
        let mut s = self;
        if let Node::Union {
            key,
            tags,
            branches,
        } = &schema.nodes[top.node as usize]
        {
            let (
                Lex::EnumText {
                    node,
                    len,
                    candidates,
                },
                Node::Enum(values),
            ) = (self.lex, &schema.nodes[*tags as usize])
            else {
                return None;
            };
            (node == *tags).then_some(())?;
            let i = (0..values.len())
                .find(|&i| candidates >> i & 1 == 1 && values[i].len() == len as usize)?;
            let Node::Object { properties, .. } = &schema.nodes[branches[i] as usize] else {
                return None;
            };
            let k = properties.iter().position(|(name, _)| name == key)?;
            s.set_top(Frame {
                node: branches[i],
                progress: 1 << k,
            });
            return s.with(Lex::Next);
        }
        if matches!(schema.nodes[top.node as usize], Node::Array { .. }) {
            top.progress += 1;
            s.set_top(top);
        }
        s.with(Lex::Next)
    }

    fn close(self, schema: &Schema) -> Option<Self> {
        let mut s = self;
        s.depth -= 1;
        s.value_done(schema)
    }

    /// The properties a key may name: those not given yet.
    /// The properties an object of `properties`, at most `most` of them, may still be given
    /// after those `given`, one bit each.
    fn key_candidates(properties: &[(Vec<u8>, NodeId)], most: u8, given: u64) -> u64 {
        if properties.is_empty() || given.count_ones() >= u32::from(most) {
            return 0;
        }
        let all = u64::MAX >> (64 - properties.len());
        all & !given
    }

    /// Whether an object may close once the properties `given` are in.
    fn object_whole(required: u64, fewest: u8, given: u64) -> bool {
        required & !given == 0 && given.count_ones() >= u32::from(fewest)
    }

    /// The first byte of a value of `node`.
    fn value(self, schema: &Schema, node: NodeId, b: u8) -> Option<Self> {
        if !has(&schema.starts[node as usize], b) {
            return None;
        }
        match &schema.nodes[node as usize] {
            Node::Any { object } => {
                let free = if *object {
                    JsonPrefix::default()
                } else {
                    JsonPrefix::any_value()
                };
                self.with(Lex::Free(free.advance(b)?))
            }
            Node::Null => self.with(Lex::Word(Word::start(b, false, true)?)),
            Node::Boolean => self.with(Lex::Word(Word::start(b, true, false)?)),
            Node::Number { integer } => self.with(Lex::Number {
                integer: *integer,
                part: Number::start(b)?,
            }),
            Node::String => self.with(Lex::Str {
                key: false,
                lex: Str::default(),
            }),
            Node::Enum(values) => {
                let candidates = values
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v[0] == b)
                    .fold(0u64, |bits, (i, _)| bits | 1 << i);
                self.with(Lex::EnumText {
                    node,
                    len: 1,
                    candidates,
                })
            }
            Node::Array { .. } => self.open(node, Lex::ArrayFirst),
            Node::Object { .. } | Node::Map { .. } => self.open(node, Lex::Key { close: true }),
            Node::Union { .. } => self.open(node, Lex::UnionKey { len: 0 }),
            Node::AnyOf(branches) => {
                let br = *branches
                    .iter()
                    .find(|&&br| has(&schema.starts[br as usize], b))?;
                self.value(schema, br, b)
            }
        }
    }

    /// Whether the enum value being read is one of the values, whole.
    fn enum_whole(&self, schema: &Schema) -> Option<()> {
        let Lex::EnumText {
            node,
            len,
            candidates,
        } = self.lex
        else {
            return None;
        };
        let Node::Enum(values) = &schema.nodes[node as usize] else {
            return None;
        };
        values
            .iter()
            .enumerate()
            .any(|(i, v)| candidates >> i & 1 == 1 && v.len() == len as usize)
            .then_some(())
    }

    fn advance(self, schema: &Schema, b: u8) -> Option<Self> {
        let between = matches!(
            self.lex,
            Lex::Value(_)
                | Lex::ArrayFirst
                | Lex::Key { .. }
                | Lex::Colon { .. }
                | Lex::MapColon
                | Lex::Next
                | Lex::UnionKey { len: 0 }
        );
        if between && matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            return (self.spaces < MAX_SPACES).then_some(SchemaPrefix {
                spaces: self.spaces + 1,
                ..self
            });
        }
        match self.lex {
            Lex::Value(node) => self.value(schema, node, b),
            Lex::ArrayFirst => {
                let top = self.top()?;
                let Node::Array { items, min, .. } = schema.nodes[top.node as usize] else {
                    return None;
                };
                match b {
                    b']' if min == 0 => self.close(schema),
                    _ => self.value(schema, items, b),
                }
            }
            Lex::Key { close } => {
                let top = self.top()?;
                let (properties, required, fewest, most) = match &schema.nodes[top.node as usize] {
                    Node::Object {
                        properties,
                        required,
                        fewest,
                        most,
                    } => (properties, *required, *fewest, *most),
                    Node::Map { .. } => {
                        return match b {
                            b'}' if close => self.close(schema),
                            b'"' => self.with(Lex::Str {
                                key: true,
                                lex: Str::default(),
                            }),
                            _ => None,
                        };
                    }
                    _ => return None,
                };
                match b {
                    b'}' if close && Self::object_whole(required, fewest, top.progress) => {
                        self.close(schema)
                    }
                    b'"' => {
                        let candidates = Self::key_candidates(properties, most, top.progress);
                        (candidates != 0).then_some(())?;
                        self.with(Lex::KeyText { len: 0, candidates })
                    }
                    _ => None,
                }
            }
            Lex::KeyText { len, candidates } => {
                let top = self.top()?;
                let Node::Object { properties, .. } = &schema.nodes[top.node as usize] else {
                    return None;
                };
                let alive = |i: usize| candidates >> i & 1 == 1;
                if b == b'"' {
                    let prop = (0..properties.len())
                        .find(|&i| alive(i) && properties[i].0.len() == len as usize)?;
                    return self.with(Lex::Colon { prop: prop as u8 });
                }
                let next = (0..properties.len())
                    .filter(|&i| alive(i) && properties[i].0.get(len as usize) == Some(&b))
                    .fold(0u64, |bits, i| bits | 1 << i);
                (next != 0).then_some(())?;
                self.with(Lex::KeyText {
                    len: len.checked_add(1)?,
                    candidates: next,
                })
            }
            Lex::Colon { prop } => {
                (b == b':').then_some(())?;
                let mut top = self.top()?;
                let Node::Object { properties, .. } = &schema.nodes[top.node as usize] else {
                    return None;
                };
                let node = properties[prop as usize].1;
                top.progress |= 1 << prop;
                let mut s = self;
                s.set_top(top);
                s.with(Lex::Value(node))
            }
            Lex::Next => self.next(schema, b),
            Lex::Str { key, lex } => match lex.next(b) {
                Step::Continue(lex) => self.with(Lex::Str { key, lex }),
                Step::End if key => self.with(Lex::MapColon),
                Step::End => self.value_done(schema),
                Step::Invalid => None,
            },
            Lex::MapColon => {
                (b == b':').then_some(())?;
                let Node::Map { values } = schema.nodes[self.top()?.node as usize] else {
                    return None;
                };
                self.with(Lex::Value(values))
            }
            Lex::Number { integer, part } => match part.next(b, integer) {
                Step::Continue(part) => self.with(Lex::Number { integer, part }),
                // The byte that ended the number follows the value.
                Step::End => self.value_done(schema)?.advance(schema, b),
                Step::Invalid => None,
            },
            Lex::Word(w) => match w.next(b) {
                Step::Continue(w) => self.with(Lex::Word(w)),
                Step::End => self.value_done(schema),
                Step::Invalid => None,
            },
            Lex::EnumText {
                node,
                len,
                candidates,
            } => {
                let Node::Enum(values) = &schema.nodes[node as usize] else {
                    return None;
                };
                let next = values
                    .iter()
                    .enumerate()
                    .filter(|(i, v)| candidates >> i & 1 == 1 && v.get(len as usize) == Some(&b))
                    .fold(0u64, |bits, (i, _)| bits | 1 << i);
                if next != 0 {
                    return self.with(Lex::EnumText {
                        node,
                        len: len.checked_add(1)?,
                        candidates: next,
                    });
                }
                // A whole value ends at a byte that cannot continue any value.
                self.enum_whole(schema)?;
                self.value_done(schema)?.advance(schema, b)
            }
            Lex::UnionKey { len } => {
                let Node::Union { key, tags, .. } = &schema.nodes[self.top()?.node as usize] else {
                    return None;
                };
                let n = len as usize;
                let expected = match n {
                    0 => b'"',
                    n if n <= key.len() => key[n - 1],
                    n if n == key.len() + 1 => b'"',
                    _ => b':',
                };
                (b == expected).then_some(())?;
                if n == key.len() + 2 {
                    self.with(Lex::Value(*tags))
                } else {
                    self.with(Lex::UnionKey { len: len + 1 })
                }
            }
            Lex::Free(p) => match p.advance(b) {
                Some(p) if p.is_complete() => self.value_done(schema),
                Some(p) => self.with(Lex::Free(p)),
                None if p.value_ends_here() => self.value_done(schema)?.advance(schema, b),
                None => None,
            },
            Lex::Done => None,
        }
    }

    /// After a value in a container.
    fn next(self, schema: &Schema, b: u8) -> Option<Self> {
        let top = self.top()?;
        match &schema.nodes[top.node as usize] {
            Node::Object {
                properties,
                required,
                fewest,
                most,
            } => match b {
                b',' if Self::key_candidates(properties, *most, top.progress) != 0 => {
                    self.with(Lex::Key { close: false })
                }
                b'}' if Self::object_whole(*required, *fewest, top.progress) => self.close(schema),
                _ => None,
            },
            Node::Map { .. } => match b {
                b',' => self.with(Lex::Key { close: false }),
                b'}' => self.close(schema),
                _ => None,
            },
            Node::Array { items, min, max } => match b {
                b',' if top.progress < u64::from(*max) => self.with(Lex::Value(*items)),
                b']' if top.progress >= u64::from(*min) => self.close(schema),
                _ => None,
            },
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn accepts(schema: &Schema, text: &str) -> Option<SchemaPrefix> {
        schema.start().feed(schema, text.as_bytes())
    }

    fn whole(schema: &Schema, text: &str) -> bool {
        accepts(schema, text).is_some_and(|s| s.is_complete())
    }

    fn person() -> Schema {
        Schema::compile(&json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "height": {"type": "number"},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]},
                "mood": {"enum": ["happy", "sad", 1, 12, null]},
                "extra": {}
            },
            "required": ["name", "age"],
            "$defs": {"Pet": {"type": "object", "properties": {"kind": {"const": "cat"}},
                              "required": ["kind"], "additionalProperties": false}}
        }))
        .unwrap()
    }

    /// Objects told apart by a property each requires with a value of its own: the property
    /// comes first and picks the branch, whose own properties follow; pydantic's shape (with
    /// `$ref`s and `discriminator`) too.
    #[test]
    fn unions_of_objects_are_told_apart_by_their_tag() {
        let s = Schema::compile(&json!({
            "type": "object",
            "properties": {"pet": {
                "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
                "discriminator": {"propertyName": "kind"}}},
            "required": ["pet"],
            "$defs": {
                "Cat": {"type": "object", "properties": {"kind": {"const": "cat"},
                        "lives": {"type": "integer"}}, "required": ["kind", "lives"]},
                "Dog": {"type": "object", "properties": {"good": {"type": "boolean"},
                        "kind": {"const": "dog"}}, "required": ["kind"]}}
        }))
        .unwrap();
        for text in [
            r#"{"pet": {"kind": "cat", "lives": 9}}"#,
            r#"{"pet": { "kind":"dog"}}"#,
            r#"{"pet": {"kind": "dog", "good": true}}"#,
        ] {
            assert!(whole(&s, text), "{text}");
        }
        for text in [
            r#"{"pet": {"kind": "cat"}}"#,
            r#"{"pet": {"kind": "cat", "good": true, "lives": 9}}"#,
            r#"{"pet": {"kind": "dog", "lives": 9}}"#,
            r#"{"pet": {"kind": "cow"}}"#,
            r#"{"pet": {"lives": 9, "kind": "cat"}}"#,
            r#"{"pet": {}}"#,
            r#"{"pet": {"kind": "cat", "kind": "cat", "lives": 9}}"#,
        ] {
            assert!(!whole(&s, text), "{text}");
        }
        // Objects that no required property of one value each tells apart stay refused.
        for branches in [
            json!([{"type": "object", "properties": {"a": {"type": "string"}}},
                   {"type": "object", "properties": {"b": {"type": "string"}}}]),
            json!([{"type": "object", "properties": {"k": {"const": 1}}},
                   {"type": "object", "properties": {"k": {"const": 2}}}]),
            json!([{"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]},
                   {"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]}]),
        ] {
            let e = Schema::compile(
                &json!({"type": "object", "properties": {"x": {"anyOf": branches}}}),
            );
            assert!(e.unwrap_err().to_string().contains("same byte"));
        }
    }

    #[test]
    fn values_of_the_schema_are_whole() {
        let s = person();
        for text in [
            r#"{"name": "Ann", "age": 30}"#,
            r#"{"name":"A\u00e9\n","age":-0,"height":1.5e3,"tags":["x","y"]}"#,
            r#"{"name": "B", "age": 1, "pet": {"kind": "cat"}, "mood": "sad"}"#,
            r#"{"name": "B", "age": 1, "pet": null, "mood": 12, "extra": [1, {"a": null}]}"#,
            r#"{"name": "B", "age": 1, "mood": 1, "extra": 5}"#,
            "{\n  \"name\": \"C\",\n  \"age\": 2\n}",
            r#"{"age": 2, "mood": null, "name": "D"}"#,
        ] {
            assert!(whole(&s, text), "{text}");
        }
    }

    #[test]
    fn what_the_schema_forbids_is_rejected() {
        let s = person();
        for text in [
            r#"{"age": 30}"#,
            r#"{"name": "Ann"}"#,
            r#"{"name": 5"#,
            r#"{"name": "A", "age": 1.5"#,
            r#"{"name": "A", "age": 1e3"#,
            r#"{"name": "A", "age": 1, "other""#,
            r#"{"name": "A", "age": 1, "tags": ["a", "b", "c"]"#,
            r#"{"name": "A", "age": 1, "pet": {"kind": "dog"#,
            r#"{"name": "A", "age": 1, "mood": "angry"#,
            r#"{"name": "A", "age": 1, "mood": 123"#,
            r#"{"name": "A", "age": 1, "age""#,
            r#"{"age": 1, "name": "A", "name""#,
            r#"{"name": "A", "age": 1,}"#,
            r#"{"name": "A", "age": 1}}"#,
            r#"["#,
        ] {
            assert!(accepts(&s, text).is_none(), "{text} accepted");
        }
    }

    #[test]
    fn prefixes_of_values_are_accepted() {
        let s = person();
        let text =
            r#"{"name": "B", "age": 1, "pet": {"kind": "cat"}, "mood": 12, "extra": [1, {"a": nul"#;
        for end in 0..=text.len() {
            let p = accepts(&s, &text[..end]).unwrap_or_else(|| panic!("{}", &text[..end]));
            assert!(!p.is_complete());
        }
    }

    #[test]
    fn array_bounds_and_recursion() {
        let s = Schema::compile(&json!({
            "type": "object",
            "properties": {"children": {"type": "array", "items": {"$ref": "#"}, "minItems": 1}},
        }))
        .unwrap();
        assert!(whole(&s, r#"{"children": [{"children": [{}]}]}"#));
        assert!(accepts(&s, r#"{"children": []"#).is_none());
        assert!(whole(&s, "{}"));
    }

    /// `additionalProperties` without `properties`: a schema makes a dictionary of its values,
    /// `false` the empty object, and `required` then names keys that cannot be given.
    #[test]
    fn dictionaries_and_closed_objects() {
        let s = Schema::compile(&json!({
            "type": "object",
            "properties": {
                "scores": {"type": "object", "additionalProperties": {"type": "integer"}},
                "none": {"type": "object", "additionalProperties": false},
                "free": {"type": "object"}
            }
        }))
        .unwrap();
        assert!(whole(
            &s,
            r#"{"scores": {"a b": 1, "\u00e9": -2, "": 0}, "none": {}}"#
        ));
        assert!(whole(&s, r#"{"scores": {}, "free": {"x": [true]}}"#));
        for bad in [
            r#"{"scores": {"a": "1""#,
            r#"{"scores": {"a": 1.5"#,
            r#"{"none": {""#,
            r#"{"scores": {1"#,
        ] {
            assert!(accepts(&s, bad).is_none(), "{bad} accepted");
        }
        let e = Schema::compile(&json!({"type": "object", "required": ["x"]})).expect_err("x");
        assert!(e.to_string().contains("\"x\""), "{e}");
    }

    /// References are followed as deep as the nesting limit allows, no deeper; references
    /// that only point at themselves match nothing; a schema too large is refused.
    #[test]
    fn hostile_schemas_are_bounded() {
        let chain = |n: usize| {
            let mut defs = serde_json::Map::new();
            for i in 0..n {
                defs.insert(
                    format!("d{i}"),
                    json!({"anyOf": [{"$ref": format!("#/$defs/d{}", i + 1)}]}),
                );
            }
            defs.insert(format!("d{n}"), json!({"type": "string"}));
            json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}, "$defs": defs})
        };
        let s = Schema::compile(&chain(30)).unwrap();
        assert!(whole(&s, r#"{"a": "x"}"#));
        let e = Schema::compile(&chain(1000)).expect_err("too deep");
        assert!(e.to_string().contains("nested more than 64"), "{e}");
        let wide: serde_json::Map<String, Value> = (0..40)
            .map(|i| {
                (
                    format!("p{i}"),
                    json!({"type": "array", "items": {"enum": (0..60).collect::<Vec<_>>()}}),
                )
            })
            .collect();
        let mut props = serde_json::Map::new();
        for i in 0..60 {
            props.insert(
                format!("o{i}"),
                json!({"type": "object", "properties": wide.clone()}),
            );
        }
        let e = Schema::compile(&json!({"type": "object", "properties": props}))
            .expect_err("too large");
        assert!(e.to_string().contains("more than 2048"), "{e}");
        let selfish = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/s"}},
                             "$defs": {"s": {"anyOf": [{"$ref": "#/$defs/s"}]}}, "required": ["a"]});
        let s = Schema::compile(&selfish).unwrap();
        assert!(accepts(&s, r#"{"a": "#).is_some() && accepts(&s, r#"{"a": 1"#).is_none());
        assert!(Schema::compile(&json!({"$ref": "#"})).is_err());
    }

    #[test]
    fn property_counts_bound_an_object() {
        let one_of_two = Schema::compile(&json!({
            "type": "object",
            "properties": {"call": {"type": "object"}, "response": {"type": "string"}},
            "minProperties": 1,
            "maxProperties": 1,
        }))
        .unwrap();
        assert!(whole(&one_of_two, r#"{"call": {}}"#));
        assert!(whole(&one_of_two, r#"{"response": "hi"}"#));
        assert!(
            accepts(&one_of_two, "{}").is_none(),
            "fewer than minProperties"
        );
        assert!(
            accepts(&one_of_two, r#"{"response": "hi","#).is_none(),
            "more than maxProperties"
        );
        let two_of_three = Schema::compile(&json!({
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                           "c": {"type": "integer"}},
            "minProperties": 2,
            "maxProperties": 2,
        }))
        .unwrap();
        assert!(whole(&two_of_three, r#"{"c": 1, "a": 2}"#));
        assert!(accepts(&two_of_three, r#"{"c": 1}"#).is_none());
        assert!(accepts(&two_of_three, r#"{"c": 1, "a": 2,"#).is_none());
    }

    #[test]
    fn unsupported_schemas_are_errors_naming_the_problem() {
        for (schema, words) in [
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}),
                "\"pattern\"",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "format": "date"}}}),
                "\"format\"",
            ),
            (json!({"type": "string"}), "root must be an object"),
            (
                json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"enum": ["x"]}]}}}),
                "same byte",
            ),
            (
                json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}}),
                "#/$defs/Nope",
            ),
            (
                json!({"type": "object", "properties": {}, "required": ["a"]}),
                "\"a\"",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "decimal"}}}),
                "\"decimal\"",
            ),
            (
                json!({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a", "b"],
                       "maxProperties": 1}),
                "no object has",
            ),
            (
                json!({"type": "object", "properties": {"a": {}}, "minProperties": 2}),
                "no object has",
            ),
            (
                json!({"type": "object", "additionalProperties": {"type": "string"},
                       "minProperties": 1}),
                "minProperties",
            ),
        ] {
            let e = Schema::compile(&schema).expect_err(&schema.to_string());
            assert!(e.to_string().contains(words), "{schema}: {e}");
        }
    }
}
