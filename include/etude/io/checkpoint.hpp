// Checkpoints of a training run, on the host. A resumable checkpoint is one safetensors file
// (`ckpt-<step>.safetensors`) holding the parameters (`model.<name>`), the optimiser's state
// (`optim.<slot>.<name>`) and, in its metadata, a JSON state: the update count, the compile-time
// configuration and hyperparameters with their signature, the data the run trains on, the data
// loader's state, seeds, code version and world size, the validation loss if known. Its
// `etude.checksum` is the safetensors self-digest (safetensors.hpp): XXH64 over every byte of the
// file, header and metadata included, so whatever is read was verified. (Files of format 1, whose
// checksum covered only the state and the tensor bytes, are still read.)
//
// Files are written atomically (temporary, fsync, rename, directory fsync) and never from a state
// that is not finite; the `latest` pointer is updated last, for other tools: resuming takes the
// newest checkpoint by step that verifies AND restores. Restoring checks everything first (the
// configuration, the data, every tensor's size and finiteness, the caller's own check of what
// the state holds) and changes the trainer only when all of it passes; a checkpoint that fails
// any of it gives way to the next older one, and the rejected files are named. Another
// configuration or other data is a refusal, not a fallback. Retention keeps the last N, every
// M-th step as a milestone and the best by validation loss, and never deletes the only good
// checkpoint. Saves may run on a background thread: the step blocks only while the snapshot is
// copied.
//
// Data-parallel runs (a trainer with a communicator, train/communicator.hpp): save and resume are
// collectives every rank calls, over a directory every rank sees (a shared filesystem). Without
// ZeRO-1 every rank holds the whole state and rank 0 writes the ordinary file. Under ZeRO-1 each
// rank r writes its optimiser shard `ckpt-<step>.shard-<r>-of-<W>.safetensors` (`optim.<slot>`,
// flat over the rank's range of the partition, with its own self-digest), the digests are gathered
// to rank 0, and rank 0 writes the main file LAST: the parameters and a state (format 3) whose
// "parallel" entry lists the partition, the shard files and their digests. The main file is the
// commit: shards without it are never taken (retention deletes them), and a main file whose shards
// are missing or differ from their digests is unusable like a corrupt file. A killed job therefore
// leaves the previous checkpoint as it was. Resuming works at any world size and in either
// direction: each rank assembles its own range of the optimiser state from whatever layout the
// checkpoint has (per-tensor state or shards, several of them overlapping the range partially);
// rank 0 proposes each candidate, every rank checks what it needs, and they take or reject it
// together. A distributed save is synchronous (save_async saves at once); the single-process save
// may run in the background.
// Not for: the run directory around the checkpoints (lock, logs, cleanup: track/run_directory.hpp);
// weights exchanged with other tools (save_weights/load_weights in checkpoint/weights.hpp write and
// strictly read plain safetensors with table names; io/hf_names.hpp maps them to Hugging Face's
// layout).
//
// The parts, one idea each, under io/checkpoint/ (this header includes them all):
//   error.hpp        checkpoint_error, checkpoint_mismatch, no_usable_checkpoint
//   names.hpp        file names (ckpt-<step>, shards, `latest`), metadata keys, format versions
//   run_state.hpp    run_state, describe_run, code_version: what a checkpoint records of its run
//   snapshot.hpp     checkpoint_snapshot, take_snapshot, write_snapshot: the one-file save
//   file.hpp         checkpoint_file: opening and verifying a checkpoint
//   shards.hpp       ZeRO-1 shard files and read_optimizer_range over any layout
//   restore.hpp      stage_restore, apply_restore, restore
//   manager.hpp      checkpoint_manager, retention, resume_options: save, retention, resume
//   weights.hpp      save_weights, load_weights, weight_load, weights_mismatch
//   detail/          trainer_view.hpp (what checkpoints read of a trainer: parallel layout, slot
//                    names, finiteness), collective.hpp (how ranks agree on a save or resume)
#pragma once

#include "etude/io/checkpoint/error.hpp"
#include "etude/io/checkpoint/names.hpp"
#include "etude/io/checkpoint/run_state.hpp"
#include "etude/io/checkpoint/snapshot.hpp"
#include "etude/io/checkpoint/file.hpp"
#include "etude/io/checkpoint/shards.hpp"
#include "etude/io/checkpoint/restore.hpp"
#include "etude/io/checkpoint/manager.hpp"
#include "etude/io/checkpoint/weights.hpp"
