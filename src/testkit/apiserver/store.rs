//! The emulator's object store: JSON objects keyed by resource, namespace and name, one global
//! resourceVersion counter (as etcd's revision), the change history that watches replay from
//! (and whose compaction makes old versions `410 Gone`), selectors, and the patch formats.
//! Pure data; the HTTP side ([`super::serve`]) holds it behind a mutex.

use std::collections::{BTreeMap, VecDeque};

use serde_json::{Map, Value, json};

/// The kinds the emulator knows: `(group/version path, plural, kind, namespaced, has status)`.
/// The path is `api/v1` for the core group and `apis/<group>/<version>` otherwise.
const KINDS: &[(&str, &str, &str, bool, bool)] = &[
    ("api/v1", "nodes", "Node", false, true),
    ("api/v1", "events", "Event", true, false),
    ("api/v1", "pods", "Pod", true, true),
    ("api/v1", "configmaps", "ConfigMap", true, false),
    ("api/v1", "namespaces", "Namespace", false, true),
    ("apis/events.k8s.io/v1", "events", "Event", true, false),
    (
        "apis/resource.k8s.io/v1",
        "resourceslices",
        "ResourceSlice",
        false,
        false,
    ),
    (
        "apis/resource.k8s.io/v1",
        "resourceclaims",
        "ResourceClaim",
        true,
        true,
    ),
    (
        "apis/resource.k8s.io/v1",
        "resourceclaimtemplates",
        "ResourceClaimTemplate",
        true,
        false,
    ),
    (
        "apis/resource.k8s.io/v1",
        "deviceclasses",
        "DeviceClass",
        false,
        false,
    ),
];

/// One kind of object, as found from a URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Kind {
    /// `api/v1` or `apis/<group>/<version>`.
    pub(crate) path: &'static str,
    /// The URL plural (`nodes`).
    pub(crate) plural: &'static str,
    /// The object `kind` (`Node`).
    pub(crate) kind: &'static str,
    pub(crate) namespaced: bool,
    /// Writes to the main resource keep the stored `status`; `/status` writes change only it.
    pub(crate) has_status: bool,
}

impl Kind {
    /// The kind served at `path` (`api/v1`, `apis/g/v`) under `plural`.
    pub(crate) fn find(path: &str, plural: &str) -> Option<Kind> {
        KINDS
            .iter()
            .find(|k| k.0 == path && k.1 == plural)
            .map(|k| Kind {
                path: k.0,
                plural: k.1,
                kind: k.2,
                namespaced: k.3,
                has_status: k.4,
            })
    }

    /// The kind of a `k8s-openapi` type.
    pub(crate) fn of<K: k8s_openapi::Resource>() -> Option<Kind> {
        let path = if K::GROUP.is_empty() {
            format!("api/{}", K::VERSION)
        } else {
            format!("apis/{}/{}", K::GROUP, K::VERSION)
        };
        Kind::find(&path, K::URL_PATH_SEGMENT)
    }

    /// The `apiVersion` objects of this kind carry.
    pub(crate) fn api_version(&self) -> &'static str {
        self.path
            .strip_prefix("apis/")
            .or_else(|| self.path.strip_prefix("api/"))
            .unwrap_or(self.path)
    }
}

/// Where one object lives.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key {
    pub(crate) kind: Kind,
    /// Empty for cluster-scoped objects.
    pub(crate) namespace: String,
    pub(crate) name: String,
}

/// What a change did, as a watch reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeType {
    Added,
    Modified,
    Deleted,
}

impl ChangeType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ChangeType::Added => "ADDED",
            ChangeType::Modified => "MODIFIED",
            ChangeType::Deleted => "DELETED",
        }
    }
}

/// One entry of the history: the object after the change (before it, for a delete).
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) rv: u64,
    pub(crate) key: Key,
    pub(crate) change: ChangeType,
    pub(crate) object: Value,
    pub(crate) old: Option<Value>,
}

/// The store itself.
#[derive(Debug, Default)]
pub(crate) struct Store {
    /// The last resourceVersion handed out.
    pub(crate) rv: u64,
    pub(crate) objects: BTreeMap<Key, Value>,
    pub(crate) history: VecDeque<Change>,
    /// Watches from a version below this are answered `410 Gone`.
    pub(crate) oldest: u64,
    uids: u64,
}

/// How many changes the history keeps before the oldest are compacted.
const HISTORY: usize = 10_000;

impl Store {
    /// Stores `object` at `key` with a new resourceVersion and records the change. Creation
    /// fills `uid`, `creationTimestamp` and `generation`; a changed `spec` bumps `generation`.
    pub(crate) fn put(&mut self, key: Key, mut object: Value) -> Value {
        self.rv += 1;
        let old = self.objects.get(&key).cloned();
        let meta = metadata_mut(&mut object);
        meta.insert("name".into(), json!(key.name));
        if key.kind.namespaced {
            meta.insert("namespace".into(), json!(key.namespace));
        }
        meta.insert("resourceVersion".into(), json!(self.rv.to_string()));
        match &old {
            None => {
                self.uids += 1;
                meta.entry("uid").or_insert_with(|| {
                    json!(format!("00000000-0000-4000-8000-{:012x}", self.uids))
                });
                meta.entry("creationTimestamp")
                    .or_insert_with(|| json!(k8s_openapi::jiff::Timestamp::now().to_string()));
                meta.insert("generation".into(), json!(1));
            }
            Some(old) => {
                for field in ["uid", "creationTimestamp"] {
                    if let Some(v) = old.pointer(&format!("/metadata/{field}")) {
                        meta.insert(field.into(), v.clone());
                    }
                }
                let generation = old
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(1);
                let bumped = old.get("spec") != object.get("spec");
                metadata_mut(&mut object)
                    .insert("generation".into(), json!(generation + i64::from(bumped)));
            }
        }
        if let Some(obj) = object.as_object_mut() {
            obj.insert("kind".into(), json!(key.kind.kind));
            obj.insert("apiVersion".into(), json!(key.kind.api_version()));
        }
        self.objects.insert(key.clone(), object.clone());
        let change = if old.is_some() {
            ChangeType::Modified
        } else {
            ChangeType::Added
        };
        self.record(Change {
            rv: self.rv,
            key,
            change,
            object: object.clone(),
            old,
        });
        object
    }

    /// Removes the object at `key`, recording the delete (with a fresh resourceVersion).
    pub(crate) fn remove(&mut self, key: &Key) -> Option<Value> {
        let mut object = self.objects.remove(key)?;
        self.rv += 1;
        metadata_mut(&mut object).insert("resourceVersion".into(), json!(self.rv.to_string()));
        self.record(Change {
            rv: self.rv,
            key: key.clone(),
            change: ChangeType::Deleted,
            object: object.clone(),
            old: None,
        });
        Some(object)
    }

    fn record(&mut self, change: Change) {
        self.history.push_back(change);
        while self.history.len() > HISTORY {
            if let Some(dropped) = self.history.pop_front() {
                self.oldest = dropped.rv;
            }
        }
    }

    /// Forgets the whole history: watches resuming from any version seen so far get 410.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.oldest = self.rv;
    }

    /// The objects of `kind` (in `namespace` if given) that match `selectors`.
    pub(crate) fn list(&self, kind: Kind, namespace: Option<&str>, sel: &Selectors) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|(k, _)| k.kind == kind && namespace.is_none_or(|ns| k.namespace == ns))
            .filter(|(_, v)| sel.matches(v))
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// The `metadata` map of `object`, created when missing.
pub(crate) fn metadata_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.is_object() {
        *object = json!({});
    }
    let Some(obj) = object.as_object_mut() else {
        unreachable!("made an object above")
    };
    let meta = obj.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    match meta.as_object_mut() {
        Some(m) => m,
        None => unreachable!("made an object above"),
    }
}

/// `metadata.resourceVersion` of `object`, when set and not empty.
pub(crate) fn resource_version(object: &Value) -> Option<&str> {
    object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// A parsed `fieldSelector` and `labelSelector`.
#[derive(Debug, Default, Clone)]
pub(crate) struct Selectors {
    fields: Vec<(String, Op)>,
    labels: Vec<(String, Op)>,
}

#[derive(Debug, Clone)]
enum Op {
    Eq(String),
    Ne(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    Absent,
}

impl Op {
    fn matches(&self, value: Option<&str>) -> bool {
        match self {
            Op::Eq(v) => value == Some(v.as_str()),
            // As the API server: `k!=v` also matches objects without `k`.
            Op::Ne(v) => value != Some(v.as_str()),
            Op::In(vs) => value.is_some_and(|x| vs.iter().any(|v| v == x)),
            Op::NotIn(vs) => value.is_none_or(|x| vs.iter().all(|v| v != x)),
            Op::Exists => value.is_some(),
            Op::Absent => value.is_none(),
        }
    }
}

impl Selectors {
    /// Parses the two selectors as the query string carries them.
    pub(crate) fn parse(fields: Option<&str>, labels: Option<&str>) -> Result<Selectors, String> {
        let mut out = Selectors::default();
        for term in split_terms(fields.unwrap_or("")) {
            let op =
                parse_term(term).ok_or_else(|| format!("invalid field selector term {term:?}"))?;
            if matches!(op.1, Op::In(_) | Op::NotIn(_) | Op::Exists | Op::Absent) {
                return Err(format!(
                    "field selector term {term:?}: only =, == and != are allowed"
                ));
            }
            out.fields.push(op);
        }
        for term in split_terms(labels.unwrap_or("")) {
            out.labels.push(
                parse_term(term).ok_or_else(|| format!("invalid label selector term {term:?}"))?,
            );
        }
        Ok(out)
    }

    /// Whether `object` matches every term.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        let fields = self.fields.iter().all(|(path, op)| {
            let pointer = format!("/{}", path.replace('.', "/"));
            op.matches(object.pointer(&pointer).and_then(Value::as_str))
        });
        let labels = self.labels.iter().all(|(key, op)| {
            let labels = object
                .pointer("/metadata/labels")
                .and_then(Value::as_object);
            op.matches(labels.and_then(|l| l.get(key)).and_then(Value::as_str))
        });
        fields && labels
    }
}

/// Splits on commas outside parentheses.
fn split_terms(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0usize, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out.into_iter().filter(|t| !t.is_empty()).collect()
}

fn parse_term(term: &str) -> Option<(String, Op)> {
    let set = |rest: &str| -> Option<Vec<String>> {
        let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
        Some(inner.split(',').map(|v| v.trim().to_owned()).collect())
    };
    if let Some(key) = term.strip_prefix('!') {
        return Some((key.trim().to_owned(), Op::Absent));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Some((k.trim().to_owned(), Op::Ne(v.trim().to_owned())));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Some((k.trim().to_owned(), Op::Eq(v.trim().to_owned())));
    }
    if let Some((k, rest)) = term.split_once(" notin ") {
        return Some((k.trim().to_owned(), Op::NotIn(set(rest)?)));
    }
    if let Some((k, rest)) = term.split_once(" in ") {
        return Some((k.trim().to_owned(), Op::In(set(rest)?)));
    }
    let key = term.trim();
    (!key.is_empty() && !key.contains(' ')).then(|| (key.to_owned(), Op::Exists))
}

/// RFC 7386 JSON merge patch (also what the emulator does for strategic merge: maps merge,
/// lists are replaced, `null` deletes).
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Some(target) = target.as_object_mut() else {
        return;
    };
    for (k, v) in patch {
        if v.is_null() {
            target.remove(k);
        } else if k == "$patch" || k.starts_with("$setElementOrder") {
            // Strategic-merge directives: lists are replaced wholesale here.
        } else {
            merge_patch(target.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// RFC 6902 JSON patch: `add`, `remove`, `replace`, `test`.
pub(crate) fn json_patch(target: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops
        .as_array()
        .ok_or("a JSON patch is an array of operations")?;
    for op in ops {
        let name = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or("operation without \"op\"")?;
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or("operation without \"path\"")?;
        let value = op.get("value").cloned();
        match name {
            "test" => {
                if target.pointer(path) != value.as_ref() {
                    return Err(format!("test of {path} failed"));
                }
            }
            "remove" => {
                let (parent, last) = parent_of(target, path)?;
                let removed = match parent {
                    Value::Object(m) => m.remove(&last).is_some(),
                    Value::Array(a) => match last.parse::<usize>() {
                        Ok(i) if i < a.len() => {
                            a.remove(i);
                            true
                        }
                        _ => false,
                    },
                    _ => false,
                };
                if !removed {
                    return Err(format!("remove of {path}: no such member"));
                }
            }
            "add" | "replace" => {
                let value = value.ok_or_else(|| format!("{name} of {path} without a value"))?;
                let (parent, last) = parent_of(target, path)?;
                match parent {
                    Value::Object(m) => {
                        if name == "replace" && !m.contains_key(&last) {
                            return Err(format!("replace of {path}: no such member"));
                        }
                        m.insert(last, value);
                    }
                    Value::Array(a) if last == "-" => a.push(value),
                    Value::Array(a) => {
                        let i: usize = last.parse().map_err(|_| format!("bad index in {path}"))?;
                        match (name, i <= a.len()) {
                            ("add", true) => a.insert(i, value),
                            ("replace", _) if i < a.len() => a[i] = value,
                            _ => return Err(format!("index out of range in {path}")),
                        }
                    }
                    _ => return Err(format!("{path}: parent is not a container")),
                }
            }
            other => return Err(format!("unsupported JSON patch op {other:?}")),
        }
    }
    Ok(())
}

fn parent_of<'a>(target: &'a mut Value, path: &str) -> Result<(&'a mut Value, String), String> {
    let (parent, last) = path
        .rsplit_once('/')
        .ok_or_else(|| format!("bad JSON pointer {path:?}"))?;
    let last = last.replace("~1", "/").replace("~0", "~");
    let parent = target
        .pointer_mut(parent)
        .ok_or_else(|| format!("{path}: parent missing"))?;
    Ok((parent, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_match_as_the_api_server_does() {
        let node = json!({"metadata": {"name": "a", "labels": {"pool": "x", "tier": "gpu"}},
                          "spec": {"nodeName": "a"}});
        let ok = |f: Option<&str>, l: Option<&str>| Selectors::parse(f, l).unwrap().matches(&node);
        assert!(ok(Some("metadata.name=a"), None));
        assert!(ok(Some("spec.nodeName==a,metadata.name!=b"), None));
        assert!(!ok(Some("metadata.name=b"), None));
        assert!(ok(None, Some("pool=x,tier in (gpu,cpu),!gone,tier")));
        assert!(!ok(None, Some("pool notin (x)")));
        assert!(Selectors::parse(Some("metadata.name in (a)"), None).is_err());
    }

    #[test]
    fn merge_and_json_patches() {
        let mut v = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": [1, 2]}});
        merge_patch(
            &mut v,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"x": [3]}}),
        );
        assert_eq!(
            v,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"x": [3]}})
        );
        json_patch(
            &mut v,
            &json!([{"op": "test", "path": "/metadata/labels/b", "value": "2"},
                    {"op": "add", "path": "/metadata/labels/d~1e", "value": "4"},
                    {"op": "remove", "path": "/metadata/labels/c"},
                    {"op": "add", "path": "/spec/x/-", "value": 9}]),
        )
        .unwrap();
        assert_eq!(v["metadata"]["labels"], json!({"b": "2", "d/e": "4"}));
        assert_eq!(v["spec"]["x"], json!([3, 9]));
        assert!(
            json_patch(
                &mut v,
                &json!([{"op": "replace", "path": "/nope/x", "value": 1}])
            )
            .is_err()
        );
    }

    #[test]
    fn store_versions_generations_and_compaction() {
        let kind = Kind::find("apis/resource.k8s.io/v1", "resourceslices").unwrap();
        let key = Key {
            kind,
            namespace: String::new(),
            name: "s".into(),
        };
        let mut store = Store::default();
        let a = store.put(key.clone(), json!({"spec": {"driver": "d"}}));
        assert_eq!(a["metadata"]["generation"], 1);
        let b = store.put(
            key.clone(),
            json!({"metadata": {"labels": {"x": "y"}}, "spec": {"driver": "d"}}),
        );
        assert_eq!(b["metadata"]["generation"], 1, "no spec change, no bump");
        assert_eq!(b["metadata"]["uid"], a["metadata"]["uid"]);
        let c = store.put(key.clone(), json!({"spec": {"driver": "e"}}));
        assert_eq!(c["metadata"]["generation"], 2);
        assert_eq!(resource_version(&c), Some("3"));
        store.remove(&key);
        assert_eq!(store.history.len(), 4);
        store.compact();
        assert_eq!((store.history.len(), store.oldest), (0, 4));
    }
}
