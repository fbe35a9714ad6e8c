// Package models keeps which models each worker serves — base models and
// loaded LoRA adapters — so that a request is only routed to a worker that
// can answer it, and /v1/models can answer for the whole pool.
//
// A worker's list is the union of the models declared for it in the
// configuration (workers[].models, always taken as served: the operator's
// word, and the only source for a worker whose /v1/models is unusable) and
// the last list its /v1/models returned (learned on every health probe, so
// an adapter loaded or unloaded at runtime is seen within one interval). A
// failed fetch keeps the last learned list. A worker with neither has an
// unknown list.
//
// Registry holds each worker's models: its /v1/models answer from the last
// health round (fetched right after the health probe, with the worker key; a
// failed or unparsable fetch keeps the last list) unioned with
// workers[].models. Choice: declared models are added, never replaced by
// probing: the declaration is the operator's word (and the only source for an
// engine whose /v1/models is unusable), while probing is what sees adapters
// come and go. The engine stays pure and model-blind: the proxy turns the
// request's model into workers to exclude (Registry.Exclude, a lock-free
// snapshot rebuilt only when a list changes) and adds them to Request.Exclude,
// which the engine, the Route RPC and the local fallback already honour, as
// does the breaker trial (a trial never goes to a worker without the model). A
// model listed by some worker excludes every other worker, including those
// with an unknown list (a worker known to have the adapter beats a guess); a
// model listed nowhere goes to the unknown-list workers, or is a 404 when
// every list is known. On the control plane the leader keeps its own registry
// (soft state, like health: rebuilt by a new leader's first probe round),
// sends the ids in Worker.models on Sync, and filters Route again, answering
// NOT_FOUND. Pass-through paths are filtered by the top-level model of a JSON
// body (embeddings, rerank, score...).
package models
