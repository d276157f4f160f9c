//! `sapient serve`: an OpenAI-compatible HTTP server (axum on a small tokio runtime) in front of
//! the continuous-batching engine (one thread, the model's KV slots, rayon for the mat-muls).
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::{middleware, Router};
use sapient_core::{KvFormat, Model};

use crate::chat::{self, ChatTemplate};
use crate::infill::Fim;
use crate::load::ModelFiles;
use crate::tokenizer::Tokenizer;
use crate::Rayon;

pub mod api;
mod detokenize;
pub mod engine;
mod listener;
pub mod metrics;

pub struct ServeOptions {
    pub addr: SocketAddr,
    /// Requests generating at once (KV slots).
    pub parallel: usize,
    /// Positions per slot.
    pub ctx: usize,
    /// Most tokens per forward pass.
    pub batch: usize,
    pub kv: KvFormat,
    pub api_key: Option<String>,
    /// Requests that may wait for a slot before new ones get 503.
    pub queue_limit: usize,
    /// Largest `max_tokens` a request may ask for.
    pub max_tokens_limit: usize,
    /// Largest request body.
    pub body_limit: usize,
    /// Open connections at once; more wait to be accepted.
    pub max_connections: usize,
    /// How long running requests may take to finish after SIGTERM or Ctrl-C.
    pub shutdown_grace: Duration,
    /// How long a client may take to send a request's head (and to start the next one on a
    /// kept-alive connection) before it is disconnected.
    pub header_timeout: Duration,
    /// The name `/v1/models` lists and requests must give.
    pub model_id: String,
    /// A chat template to use instead of the model's.
    pub chat_template_file: Option<std::path::PathBuf>,
    /// Chat replies' reasoning (`<think>...</think>`) in `reasoning_content`, not `content`.
    pub reasoning: bool,
}

/// Where the engine's KV slots live and its forward passes run.
pub enum ServeBackend<'a, 'w> {
    /// The model's weights on the CPU, mat-muls on the rayon pool.
    Cpu(&'a Model<'w>, &'a Rayon),
    /// A GPU session of `--parallel` KV slots.
    #[cfg(feature = "gpu")]
    Gpu(&'a crate::gpu::GpuModel),
}

/// Serves the model of `files` on `backend` until SIGTERM or Ctrl-C.
pub fn serve(files: &ModelFiles, backend: ServeBackend<'_, '_>, opts: ServeOptions) -> Result<()> {
    let tokenizer = Arc::new(Tokenizer::load(files)?);
    let template = ChatTemplate::load(files, &tokenizer, opts.chat_template_file.as_deref())?;
    let eos = files.eos_token_ids.clone();
    let mut end_of_turn = eos.clone();
    end_of_turn.extend(chat::end_of_turn_ids(&tokenizer));
    let fim = Fim::find(&tokenizer, files.gguf())?;
    let mut fim_stop = eos.clone();
    fim_stop.extend(fim.iter().flat_map(|f| f.end_ids()));
    let (engine_tx, engine_rx) = std::sync::mpsc::channel();
    let metrics = Arc::new(metrics::Metrics::default());
    let state = Arc::new(api::AppState {
        engine: engine_tx,
        tokenizer,
        template,
        model_id: opts.model_id.clone(),
        api_key: opts.api_key.clone(),
        metrics: metrics.clone(),
        ctx: opts.ctx,
        reasoning: opts.reasoning,
        eos,
        end_of_turn,
        queue_limit: opts.queue_limit,
        max_tokens_limit: opts.max_tokens_limit,
        vocab_size: files.config.vocab_size,
        body_limit: opts.body_limit,
        sorted_vocab: std::sync::OnceLock::new(),
        fim,
        fim_stop,
        responses: api::ResponseStore::default(),
        default_breakers: std::sync::OnceLock::new(),
    });
    let cfg = engine::EngineConfig {
        parallel: opts.parallel,
        ctx: opts.ctx,
        batch: opts.batch,
        kv: opts.kv,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    std::thread::scope(|s| {
        let engine = s.spawn(|| match backend {
            ServeBackend::Cpu(model, exec) => {
                engine::run_cpu(model, exec, &cfg, engine_rx, &metrics)
            }
            #[cfg(feature = "gpu")]
            ServeBackend::Gpu(model) => engine::run_gpu(model, &cfg, engine_rx, &metrics),
        });
        let served = runtime.block_on(http(state, &opts));
        // The router and its sender are gone: the engine ends once its requests are.
        runtime.shutdown_timeout(Duration::from_secs(1));
        let ran = engine
            .join()
            .map_err(|_| anyhow::anyhow!("the engine thread panicked"))?;
        served.and(ran)
    })
}

async fn http(state: Arc<api::AppState>, opts: &ServeOptions) -> Result<()> {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(api::chat_completions))
        .route("/v1/completions", post(api::completions))
        .route("/infill", post(api::infill))
        .route("/v1/messages", post(api::messages))
        .route("/v1/messages/count_tokens", post(api::count_tokens))
        .route("/v1/responses", post(api::create_response))
        .route(
            "/v1/responses/{id}",
            get(api::get_response).delete(api::delete_response),
        )
        .route("/completion", post(api::completion))
        .route("/completions", post(api::completion))
        .route("/v1/embeddings", post(api::embeddings))
        .route("/v1/models", get(api::models))
        .route("/tokenize", post(api::tokenize))
        .route("/detokenize", post(api::detokenize))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            api::authorize,
        ));
    let app = Router::new()
        .merge(v1)
        .route("/health", get(api::health))
        .route("/metrics", get(api::metrics))
        .method_not_allowed_fallback(api::method_not_allowed)
        .fallback(api::not_found)
        .layer(DefaultBodyLimit::max(opts.body_limit))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(opts.addr)
        .await
        .with_context(|| format!("cannot listen on {}", opts.addr))?;
    let listener = listener::LimitedListener::new(listener, opts.max_connections);
    eprintln!(
        "serving {} on http://{} ({} parallel, {} tokens of context each)",
        opts.model_id,
        axum::serve::Listener::local_addr(&listener)?,
        opts.parallel,
        opts.ctx
    );
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopping = stop.clone();
    let server = serve_connections(listener, app, opts.header_timeout, async move {
        shutdown_signal().await;
        eprintln!("shutting down: finishing running requests");
        stopping.notify_one();
    });
    let grace = opts.shutdown_grace;
    tokio::select! {
        () = server => Ok(()),
        () = async { stop.notified().await; tokio::time::sleep(grace).await } => {
            eprintln!("shutdown: cancelled the requests still running after {grace:?}");
            Ok(())
        }
    }
}

/// Accepts connections and serves each with `app` until `shutdown` completes, then lets the
/// open ones finish their requests (new requests on them are refused) and returns when all
/// have closed. What `axum::serve` does, plus hyper's timeout on reading a request's head: a
/// client that sends nothing, or its headers a byte at a time, is disconnected after
/// `header_timeout` instead of holding its connection place for good.
async fn serve_connections(
    mut listener: listener::LimitedListener,
    app: Router,
    header_timeout: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    use axum::serve::Listener;
    use tower::ServiceExt;

    let (closing, closed) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let io = tokio::select! {
            (io, _) = listener.accept() => io,
            () = &mut shutdown => break,
        };
        let app = app.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
            app.clone().oneshot(request.map(axum::body::Body::new))
        });
        let mut closed = closed.clone();
        connections.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout);
            let connection = builder.serve_connection(hyper_util::rt::TokioIo::new(io), service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = closed.wait_for(|c| *c) => connection.as_mut().graceful_shutdown(),
            }
            let _ = connection.await;
        });
        // Finished connections' tasks, so that the set holds only open ones.
        while connections.try_join_next().is_some() {}
    }
    let _ = closing.send(true);
    while connections.join_next().await.is_some() {}
}

/// SIGTERM (what an orchestrator sends) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
