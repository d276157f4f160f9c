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
use crate::load::ModelFiles;
use crate::tokenizer::Tokenizer;
use crate::Rayon;

pub mod api;
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
    /// The name `/v1/models` lists and requests must give.
    pub model_id: String,
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
    let template = ChatTemplate::load(files, &tokenizer)?;
    let eos = files.eos_token_ids.clone();
    let mut end_of_turn = eos.clone();
    end_of_turn.extend(chat::end_of_turn_ids(&tokenizer));
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
        eos,
        end_of_turn,
        queue_limit: opts.queue_limit,
        max_tokens_limit: opts.max_tokens_limit,
        vocab_size: files.config.vocab_size,
        body_limit: opts.body_limit,
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
        .route("/v1/embeddings", post(api::embeddings))
        .route("/v1/models", get(api::models))
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
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown_signal().await;
        eprintln!("shutting down: finishing running requests");
        stopping.notify_one();
    });
    let grace = opts.shutdown_grace;
    tokio::select! {
        served = server => served.context("the HTTP server failed"),
        () = async { stop.notified().await; tokio::time::sleep(grace).await } => {
            eprintln!("shutdown: cancelled the requests still running after {grace:?}");
            Ok(())
        }
    }
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
