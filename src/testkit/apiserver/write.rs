//! The emulator's writes: create (`generateName` too), update, patch (merge, strategic merge
//! as merge, JSON patch, apply as merge), delete with preconditions; 409 on a stale
//! resourceVersion or a taken name; the status-subresource rules; the admission hook; and GET.

use std::collections::HashMap;

use hyper::Response;
use serde_json::{Value, json};

use super::serve::{AdmitFn, Body, Route, Shared, reason_of, respond, status};
use super::store::{Key, Store, json_patch, merge_patch, resource_version};
use super::{Admission, User, Verb};

/// A refusal, turned into a `Status` response at the edge.
pub(crate) struct Fail {
    code: u16,
    reason: &'static str,
    message: String,
}

fn fail(code: u16, reason: &'static str, message: &str) -> Fail {
    Fail {
        code,
        reason,
        message: message.to_owned(),
    }
}

impl Fail {
    pub(crate) fn into_response(self) -> Response<Body> {
        status(self.code, self.reason, &self.message)
    }
}

fn key_of(route: &Route, name: &str) -> Key {
    Key {
        kind: route.kind,
        namespace: route.namespace.clone().unwrap_or_default(),
        name: name.to_owned(),
    }
}

fn not_found(route: &Route, name: &str) -> Fail {
    fail(
        404,
        "NotFound",
        &format!("{} \"{name}\" not found", route.kind.plural),
    )
}

pub(crate) fn get(shared: &Shared, route: &Route) -> Response<Body> {
    let name = route.name.as_deref().unwrap_or("");
    match shared.store().objects.get(&key_of(route, name)) {
        Some(v) => respond(200, v),
        None => not_found(route, name).into_response(),
    }
}

pub(crate) struct WriteRequest<'a> {
    pub(crate) verb: Verb,
    pub(crate) route: &'a Route,
    pub(crate) params: &'a HashMap<String, String>,
    pub(crate) content_type: &'a str,
    pub(crate) body: Option<Value>,
    pub(crate) user: &'a User,
    pub(crate) admit: Option<&'a AdmitFn>,
}

/// Create, update, patch and delete, under one lock so that conflicts are exact.
pub(crate) fn write(shared: &Shared, req: &WriteRequest<'_>) -> Result<(u16, Value), Fail> {
    let mut store = shared.store();
    let route = req.route;
    let body = req.body.clone().unwrap_or(Value::Null);
    let name = match (&route.name, req.verb) {
        (Some(n), _) => n.clone(),
        (None, _) => created_name(&body, &store)
            .ok_or_else(|| fail(422, "Invalid", "metadata.name or generateName is required"))?,
    };
    let key = key_of(route, &name);
    let old = store.objects.get(&key).cloned();
    let (code, new) = match req.verb {
        Verb::Create if old.is_some() => {
            return Err(fail(
                409,
                "AlreadyExists",
                &format!("{} \"{name}\" already exists", route.kind.plural),
            ));
        }
        Verb::Create => {
            let mut new = body;
            // The API server drops a new claim's status: only /status writes set it.
            if route.kind.plural == "resourceclaims"
                && let Some(o) = new.as_object_mut()
            {
                o.remove("status");
            }
            (201, Some(new))
        }
        Verb::Delete => {
            let old = old.as_ref().ok_or_else(|| not_found(route, &name))?;
            check_delete_preconditions(&body, old, &name)?;
            (200, None)
        }
        Verb::Update => {
            let old = old.as_ref().ok_or_else(|| not_found(route, &name))?;
            if let Some(rv) = resource_version(&body)
                && Some(rv) != resource_version(old)
            {
                return Err(conflict(route, &name));
            }
            (200, Some(scope_to_subresource(route, old, body)))
        }
        Verb::Patch => patch(req, old.as_ref(), &name, body)?,
        _ => return Err(fail(405, "MethodNotAllowed", "unsupported verb")),
    };
    if let Some(admit) = req.admit {
        let admission = Admission {
            verb: req.verb,
            resource: route.kind.plural,
            subresource: if route.status { "status" } else { "" },
            namespace: route.namespace.as_deref().unwrap_or(""),
            name: &name,
            user: req.user,
            object: new.as_ref(),
            old_object: old.as_ref(),
        };
        if let Err(d) = admit(&admission) {
            return Err(fail(d.code, reason_of(d.code), &d.message));
        }
    }
    let out = match new {
        Some(new) => store.put(key, new),
        None => store.remove(&key).unwrap_or(Value::Null),
    };
    let rv = store.rv;
    drop(store);
    shared.notify(rv);
    Ok((code, out))
}

fn conflict(route: &Route, name: &str) -> Fail {
    let message = format!(
        "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
        route.kind.plural
    );
    fail(409, "Conflict", &message)
}

fn check_delete_preconditions(body: &Value, old: &Value, name: &str) -> Result<(), Fail> {
    let pre = |f: &str| {
        body.pointer(&format!("/preconditions/{f}"))
            .and_then(Value::as_str)
    };
    let now = |f: &str| {
        old.pointer(&format!("/metadata/{f}"))
            .and_then(Value::as_str)
    };
    for field in ["uid", "resourceVersion"] {
        if let Some(want) = pre(field)
            && Some(want) != now(field)
        {
            let message = format!(
                "Precondition failed: {field} in precondition: {want}, {field} in object meta: {}",
                now(field).unwrap_or("")
            );
            return Err(fail(409, "Conflict", &format!("{message} ({name})")));
        }
    }
    Ok(())
}

/// A main-resource write keeps the stored `status`; a `/status` write changes only `status`.
fn scope_to_subresource(route: &Route, old: &Value, mut new: Value) -> Value {
    if !route.kind.has_status {
        return new;
    }
    if route.status {
        let mut out = old.clone();
        if let (Some(o), Some(s)) = (out.as_object_mut(), new.get("status")) {
            o.insert("status".into(), s.clone());
        }
        out
    } else {
        if let Some(o) = new.as_object_mut() {
            match old.get("status") {
                Some(s) => o.insert("status".into(), s.clone()),
                None => o.remove("status"),
            };
        }
        new
    }
}

fn patch(
    req: &WriteRequest<'_>,
    old: Option<&Value>,
    name: &str,
    body: Value,
) -> Result<(u16, Option<Value>), Fail> {
    let route = req.route;
    let ct = req.content_type.split(';').next().unwrap_or("").trim();
    let apply = ct == "application/apply-patch+yaml";
    if apply && req.params.get("fieldManager").is_none_or(String::is_empty) {
        return Err(fail(
            400,
            "BadRequest",
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value",
        ));
    }
    let old = match (old, apply) {
        (Some(o), _) => o.clone(),
        // Server-side apply creates what is missing.
        (None, true) => json!({}),
        (None, false) => return Err(not_found(route, name)),
    };
    let mut new = old.clone();
    match ct {
        "application/json-patch+json" => {
            json_patch(&mut new, &body).map_err(|m| fail(422, "Invalid", &m))?;
        }
        "application/merge-patch+json"
        | "application/strategic-merge-patch+json"
        | "application/apply-patch+yaml" => {
            if let Some(rv) = resource_version(&body)
                && Some(rv) != resource_version(&old)
            {
                return Err(conflict(route, name));
            }
            merge_patch(&mut new, &body);
        }
        other => {
            return Err(fail(
                415,
                "UnsupportedMediaType",
                &format!("the body of the request was in an unknown format: {other}"),
            ));
        }
    }
    let code = if old.as_object().is_some_and(serde_json::Map::is_empty) {
        201
    } else {
        200
    };
    Ok((code, Some(scope_to_subresource(route, &old, new))))
}

/// `metadata.name`, or `generateName` plus five characters not yet taken.
fn created_name(body: &Value, store: &Store) -> Option<String> {
    if let Some(name) = body
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
    {
        return Some(name.to_owned());
    }
    let prefix = body
        .pointer("/metadata/generateName")
        .and_then(Value::as_str)?;
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = store
        .rv
        .wrapping_mul(2_654_435_761)
        .wrapping_add(store.objects.len() as u64);
    let suffix: String = (0..5)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
            n /= ALPHABET.len() as u64;
            c
        })
        .collect();
    Some(format!("{prefix}{suffix}"))
}
