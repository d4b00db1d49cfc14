// The Llama decoder over a kvdrive::KvManager: the forward pass (forward.hpp) with every attention
// of decoding done by the manager.
//   decoder_sequence.hpp  Decoder: one sequence, its prompt prefilled in chunks, then decoded
//                         token by token (warm-up, shared prefixes, teacher forcing)
//   decoder_snapshot.hpp  PrefillSnapshot: what a prefill gave the manager, for another decoder
//   decoder_batch.hpp     BatchDecoder: several Decoders' sequences decoded together
#pragma once

#include "decoder/decoder_batch.hpp"
#include "decoder/decoder_sequence.hpp"
#include "decoder/decoder_snapshot.hpp"
