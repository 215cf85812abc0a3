// libwebp's lossy encoder with its main pass on two threads, byte for byte the same output.
//
// Why: encoding the preprocessed image at the official's settings (quality 90, method 4) is
// ~90% of a preprocess call, and libwebp runs that pass (mode decisions, quantisation, token
// recording: ~80% of an encode) on one thread whatever `thread_level` says. The official runs
// the same encoder, so this pass is the only place left to be faster than it.
//
// How: macroblock rows go to two threads alternately (a wavefront). A macroblock needs the
// reconstructed row above up to one macroblock to its right, so a row runs at least two
// macroblocks behind the one above; libwebp's one-row context arrays (top samples, non-zero
// flags, diffusion errors) are then read and written in the same order as in the serial loop.
// Each thread has its own shallow copy of the encoder: the shared per-frame arrays are the
// same pointers, while the token statistics the recording updates and the filter's edge maxima
// are its own. What remains order-dependent is handled exactly:
// - the serial loop refreshes its cost tables every `max_count + 1` macroblocks from the
//   statistics of every macroblock before that point. Here macroblock i is coded only after
//   refresh (i + 1) / (max_count + 1) has happened, and refresh j waits until every macroblock
//   before its point is done, so each macroblock sees the tables the serial loop gave it;
// - the statistics are saturating counters (halved on overflow), so their value depends on
//   the order of updates. They are rebuilt on the real encoder by replaying the recorded
//   tokens in raster order, each proba-coded token one update, exactly as recording does;
// - the tokens are kept per row and emitted row after row: the serial token stream.
// The serial loop stays for every configuration this one does not cover (progress hooks,
// statistics and extra-info outputs, several passes or a target size, autofilter) and for
// small pictures; `tests::parallel_equals_serial` (webp.rs) compares the two byte for byte.
//
// libwebp's frame loop and top-level encode (libwebp/, unmodified copies of libwebp 1.6.0 as
// libwebp-sys 0.14.4 builds it) are compiled into this file with their globals renamed, so
// their static helpers (SetLoopParams, RecordTokens, FinalizeTokenProbas, ...) are the ones
// called here and the real library linked from libwebp-sys is left as it is.

#define VP8Cat3 DrVP8Cat3
#define VP8Cat4 DrVP8Cat4
#define VP8Cat5 DrVP8Cat5
#define VP8Cat6 DrVP8Cat6
#define VP8EncLoop DrVP8EncLoop
#define VP8EncTokenLoop DrVP8EncTokenLoopSerial
#include "src/enc/frame_enc.c"

#if defined(WEBP_USE_THREAD) && !defined(_WIN32) && !defined(DISABLE_TOKEN_BUFFER)
#define DR_WAVEFRONT 1
#include <pthread.h>
#include <stdatomic.h>
#endif

#if defined(DR_WAVEFRONT)

// The token pages' layout, private to token_enc.c: a link, then `page_size` tokens written from
// the end of the page backwards; bit 15 the coded bit, bit 14 set for a fixed probability,
// otherwise the low 14 bits index the statistics (TOKEN_ID there).
struct VP8Tokens {
  VP8Tokens* next;
};
#define DR_FIXED_PROBA_BIT (1u << 14)
#define DR_PAGE_DATA(p) ((const uint16_t*)&(p)[1])
// Tokens per page of a row's buffer. A macroblock records at most 7,625 tokens (25 blocks, 400
// coefficients; per coefficient at most 19 in VP8RecordCoeffTokens: 6 coded, 11 extra bits,
// the sign and the next end-of-block test; one more per block), so it never fills more than
// one new page, which the count in EncodeRows relies on.
#define DR_ROW_PAGE_SIZE 16384
// Below this many macroblocks a second thread costs more than it saves.
#define DR_MIN_MBS 64
// Polls of a condition (a few microseconds) before sleeping on it: short, so that a thread
// whose partner is off the CPU (more threads than cores) gives its core back soon.
#define DR_SPINS 100

typedef struct {
  VP8Encoder* enc;           // the real encoder: statistics, probabilities, output
  VP8Encoder copies[2];      // one per thread (see the top of the file)
  VP8EncIterator its[2];
  int mb_w, mb_h;
  int period;                // macroblocks between two cost refreshes: max_count + 1
  VP8TBuffer* rows;          // tokens of each macroblock row
  int* mb_tokens;            // tokens in its row once a macroblock is recorded
  atomic_int* done;          // macroblocks finished, per row
  atomic_int epoch;          // cost refreshes made
  atomic_int failed;         // out of memory on either thread
  int replayed;              // macroblocks whose statistics are on the real encoder
  uint64_t size_p0[2];       // header bits, per thread (the partition-0 limit)
  pthread_mutex_t lock;
  pthread_cond_t wake;
  uint64_t generation;       // bumped under `lock` at each progress someone sleeps on
  atomic_int sleepers;       // threads in (or entering) pthread_cond_wait
  int sync_ready;            // lock and wake initialised
} Wavefront;

// Set by deepring_webp_encode_one_thread (tests): the schedule in raster order, no thread.
static _Thread_local int dr_one_thread;

static int MinInt(int a, int b) { return (a < b) ? a : b; }

// The serial loop's refresh count before macroblock i: its counter starts at max_count and a
// refresh precedes macroblocks max_count, 2 * max_count + 1, ...
static int EpochOf(const Wavefront* const wf, int i) { return (i + 1) / wf->period; }

// Whether every macroblock before refresh j's point is done.
static int RefreshReady(Wavefront* const wf, int j) {
  const int k = j * wf->period - 1;
  const int r = k / wf->mb_w, c = k % wf->mb_w;
  if (r > 0 && atomic_load(&wf->done[r - 1]) < wf->mb_w) return 0;
  return atomic_load(&wf->done[r]) >= c;
}

// Applies the statistics updates of tokens [from, to) of a row, in order.
static void ReplayTokens(const VP8TBuffer* const b, int from, int to, proba_t* const stats) {
  const VP8Tokens* page = b->pages;
  int base = 0;
  while (from >= base + b->page_size) {
    page = page->next;
    base += b->page_size;
  }
  for (int n = from; n < to; ++n) {
    if (n == base + b->page_size) {
      page = page->next;
      base += b->page_size;
    }
    const uint16_t token = DR_PAGE_DATA(page)[b->page_size - 1 - (n - base)];
    if (token & DR_FIXED_PROBA_BIT) continue;
    uint32_t cell = token & 0x3fffu;
    // VP8RecordCoeffTokens codes the second category bit of Cat5 / Cat6 with proba 10 but
    // counts it in statistic 9.
    if (cell % NUM_PROBAS == 10) --cell;
    VP8RecordStats(token >> 15, stats + cell);
  }
}

// Brings the real encoder's statistics up to macroblock `end` (exclusive), in raster order.
static void Replay(Wavefront* const wf, int end) {
  proba_t* const stats = &wf->enc->proba.stats[0][0][0][0];
  while (wf->replayed < end) {
    const int y = wf->replayed / wf->mb_w, x = wf->replayed % wf->mb_w;
    const int last = MinInt(wf->mb_w, x + (end - wf->replayed));  // exclusive
    const int* const counts = wf->mb_tokens + y * wf->mb_w;
    ReplayTokens(&wf->rows[y], (x == 0) ? 0 : counts[x - 1], counts[last - 1], stats);
    wf->replayed += last - x;
  }
}

// Refresh j, as the serial loop makes it, then handed to both threads' encoders. Called with
// `lock` held while no thread is coding (every macroblock before the point is done, none
// after it can start).
static void Refresh(Wavefront* const wf, int j) {
  VP8EncProba* const proba = &wf->enc->proba;
  Replay(wf, j * wf->period - 1);
  FinalizeTokenProbas(proba);
  VP8CalculateLevelCosts(proba);
  // The copies' cost pointers then point into the real encoder's tables, which only change
  // here; their own statistics are never read.
  wf->copies[0].proba = *proba;
  wf->copies[1].proba = *proba;
  atomic_store(&wf->epoch, j);
}

// Publishes progress (made with a sequentially consistent store) to a sleeping thread. A
// sleeper counts itself before re-reading the progress under the lock: either it sees the
// store or this sees it and wakes it.
static void Progress(Wavefront* const wf) {
  if (atomic_load(&wf->sleepers) == 0) return;
  pthread_mutex_lock(&wf->lock);
  ++wf->generation;
  pthread_cond_broadcast(&wf->wake);
  pthread_mutex_unlock(&wf->lock);
}

// Replays the statistics of the macroblocks done so far, in raster order, up to the next
// refresh point (those after it belong to later refreshes). Called with `lock` held by a
// thread with nothing to code, so that the refresh itself has little left to replay.
static void ReplayDone(Wavefront* const wf) {
  const int n = wf->mb_w * wf->mb_h;
  const int limit = MinInt(n, (atomic_load(&wf->epoch) + 1) * wf->period - 1);
  int m = wf->replayed;
  while (m < limit) {
    const int r = m / wf->mb_w;
    const int done = atomic_load(&wf->done[r]);
    if (r * wf->mb_w + done <= m) break;
    m = MinInt(r * wf->mb_w + done, limit);
    if (done < wf->mb_w) break;
  }
  Replay(wf, m);
}

// Whether row y - 1 has `above` macroblocks done (row 0 has none above it).
static int AboveDone(Wavefront* const wf, int y, int above) {
  return y == 0 || atomic_load(&wf->done[y - 1]) >= above;
}

// Whether the caller of WaitTurn can neither code nor make the refresh it needs yet.
static int Blocked(Wavefront* const wf, int y, int need, int above) {
  if (atomic_load(&wf->failed)) return 0;
  const int epoch = atomic_load(&wf->epoch);
  return (epoch < need) ? !RefreshReady(wf, epoch + 1) : !AboveDone(wf, y, above);
}

// Waits until macroblock (x, y) may be coded: the row above is two macroblocks ahead (or
// done) and the cost tables are those of its epoch, making the refresh when it is due.
// 0 when the other thread failed.
static int WaitTurn(Wavefront* const wf, int y, int x) {
  const int need = EpochOf(wf, y * wf->mb_w + x);
  const int above = MinInt(x + 2, wf->mb_w);
  int spins = 0;
  for (;;) {
    if (atomic_load(&wf->failed)) return 0;
    const int epoch = atomic_load(&wf->epoch);
    if (epoch >= need && AboveDone(wf, y, above)) return 1;
    if (epoch < need && RefreshReady(wf, epoch + 1)) {
      pthread_mutex_lock(&wf->lock);
      if (atomic_load(&wf->epoch) == epoch) {
        Refresh(wf, epoch + 1);
        ++wf->generation;
        pthread_cond_broadcast(&wf->wake);
      }
      pthread_mutex_unlock(&wf->lock);
      continue;
    }
    if (spins == 0 && pthread_mutex_trylock(&wf->lock) == 0) {
      ReplayDone(wf);
      pthread_mutex_unlock(&wf->lock);
    }
    if (++spins < DR_SPINS) continue;
    // Sleep until the next progress (see Progress).
    spins = 0;
    pthread_mutex_lock(&wf->lock);
    atomic_fetch_add(&wf->sleepers, 1);
    const uint64_t seen = wf->generation;
    if (Blocked(wf, y, need, above)) {
      while (wf->generation == seen) pthread_cond_wait(&wf->wake, &wf->lock);
    }
    atomic_fetch_sub(&wf->sleepers, 1);
    pthread_mutex_unlock(&wf->lock);
  }
}

// Codes rows first, first + step, ... on thread t; 0 on failure.
static int EncodeRows(Wavefront* const wf, int t, int first, int step) {
  VP8EncIterator* const it = &wf->its[t];
  const VP8RDLevel rd_opt = wf->enc->rd_opt_level;
  for (int y = first; y < wf->mb_h; y += step) {
    VP8TBuffer* const tokens = &wf->rows[y];
    int count = 0;
    VP8IteratorSetRow(it, y);
    for (int x = 0; x < wf->mb_w; ++x) {
      VP8ModeScore info;
      if (!WaitTurn(wf, y, x)) return 0;
      VP8IteratorImport(it, NULL);
      VP8Decimate(it, &info, rd_opt);
      const int left = tokens->left;
      if (!RecordTokens(it, &info, tokens)) {
        atomic_store(&wf->failed, 1);
        Progress(wf);  // nothing else will
        return 0;
      }
      // At most one new page per macroblock (DR_ROW_PAGE_SIZE).
      count += (tokens->left <= left) ? left - tokens->left
                                      : left + tokens->page_size - tokens->left;
      wf->mb_tokens[y * wf->mb_w + x] = count;
      wf->size_p0[t] += info.H;
      StoreSideInfo(it);
      VP8StoreFilterStats(it);
      VP8IteratorExport(it);
      VP8IteratorSaveBoundary(it);
      atomic_store(&wf->done[y], x + 1);
      Progress(wf);
      VP8IteratorNext(it);
    }
  }
  return 1;
}

static void* OddRows(void* const arg) {
  Wavefront* const wf = (Wavefront*)arg;
  EncodeRows(wf, 1, 1, 2);
  return NULL;
}

// One pass of the token loop over all macroblocks; the caller has set the loop parameters.
static int WavefrontPass(Wavefront* const wf) {
  VP8Encoder* const enc = wf->enc;
  const int n = wf->mb_w * wf->mb_h;
  for (int t = 0; t < 2; ++t) {
    wf->copies[t] = *enc;
    wf->size_p0[t] = 0;
    // Clears the shared top context: both before either thread starts.
    VP8IteratorInit(&wf->copies[t], &wf->its[t]);
    VP8InitFilter(&wf->its[t]);
  }
  for (int y = 0; y < wf->mb_h; ++y) {
    VP8TBufferClear(&wf->rows[y]);
    atomic_store(&wf->done[y], 0);
  }
  atomic_store(&wf->epoch, 0);
  atomic_store(&wf->failed, 0);
  wf->replayed = 0;
  pthread_t worker;
  int ok;
  if (!dr_one_thread && pthread_create(&worker, NULL, OddRows, wf) == 0) {
    ok = EncodeRows(wf, 0, 0, 2);
    if (!ok) {
      atomic_store(&wf->failed, 1);
      Progress(wf);
    }
    pthread_join(worker, NULL);
  } else {
    // No thread (or a test): the same schedule in raster order on this one.
    ok = EncodeRows(wf, 0, 0, 1);
  }
  ok = ok && !atomic_load(&wf->failed);
  if (ok) Replay(wf, n);
  for (int s = 0; s < NUM_MB_SEGMENTS; ++s) {
    for (int t = 0; t < 2; ++t) {
      const int edge = wf->copies[t].dqm[s].max_edge;
      if (edge > enc->dqm[s].max_edge) enc->dqm[s].max_edge = edge;
    }
  }
  return ok;
}

static int WavefrontEligible(const VP8Encoder* const enc) {
  const WebPConfig* const config = enc->config;
  const WebPPicture* const pic = enc->pic;
  return enc->thread_level > 0 && enc->use_tokens && enc->num_parts == 1 &&
         config->pass == 1 && !enc->do_search && !config->show_compressed &&
         enc->lf_stats == NULL && !enc->proba.use_skip_proba && pic->stats == NULL &&
         pic->extra_info == NULL && pic->progress_hook == NULL && enc->mb_h >= 2 &&
         enc->mb_w * enc->mb_h >= DR_MIN_MBS;
}

// Frees what NewWavefront made (a NULL or partly made one included).
static void DeleteWavefront(Wavefront* const wf) {
  if (wf == NULL) return;
  if (wf->rows != NULL) {
    for (int y = 0; y < wf->mb_h; ++y) VP8TBufferClear(&wf->rows[y]);
  }
  if (wf->sync_ready) {
    pthread_cond_destroy(&wf->wake);
    pthread_mutex_destroy(&wf->lock);
  }
  WebPSafeFree(wf->rows);
  WebPSafeFree((void*)wf->done);
  WebPSafeFree(wf->mb_tokens);
  WebPSafeFree(wf);
}

// The wavefront state for `enc`; NULL when memory runs out.
static Wavefront* NewWavefront(VP8Encoder* const enc) {
  Wavefront* const wf = (Wavefront*)WebPSafeCalloc(1ULL, sizeof(*wf));
  if (wf == NULL) return NULL;
  int max_count = (enc->mb_w * enc->mb_h) >> 3;
  if (max_count < MIN_COUNT) max_count = MIN_COUNT;
  wf->enc = enc;
  wf->mb_w = enc->mb_w;
  wf->mb_h = enc->mb_h;
  wf->period = max_count + 1;
  wf->rows = (VP8TBuffer*)WebPSafeCalloc((uint64_t)wf->mb_h, sizeof(*wf->rows));
  wf->done = (atomic_int*)WebPSafeCalloc((uint64_t)wf->mb_h, sizeof(*wf->done));
  wf->mb_tokens = (int*)WebPSafeCalloc((uint64_t)wf->mb_w * wf->mb_h, sizeof(int));
  if (wf->rows == NULL || wf->done == NULL || wf->mb_tokens == NULL) {
    DeleteWavefront(wf);
    return NULL;
  }
  for (int y = 0; y < wf->mb_h; ++y) VP8TBufferInit(&wf->rows[y], DR_ROW_PAGE_SIZE);
  pthread_mutex_init(&wf->lock, NULL);
  pthread_cond_init(&wf->wake, NULL);
  wf->sync_ready = 1;
  return wf;
}

// VP8EncTokenLoop for one pass, the wavefront way (the serial loop otherwise).
static int WavefrontTokenLoop(VP8Encoder* const enc) {
  if (!WavefrontEligible(enc)) return DrVP8EncTokenLoopSerial(enc);
  Wavefront* const wf = NewWavefront(enc);
  if (wf == NULL) return WebPEncodingSetError(enc->pic, VP8_ENC_ERROR_OUT_OF_MEMORY);
  PassStats stats;
  InitPassStats(enc, &stats);
  int ok = PreLoopInitialize(enc);
  // The serial loop's progress bookkeeping, for the percent it leaves behind.
  int remaining_progress = 40;
  while (ok) {
    remaining_progress -= remaining_progress / 2;
    SetLoopParams(enc, stats.q);
    ResetTokenStats(enc);
    ok = WavefrontPass(wf);
    if (!ok) {
      WebPEncodingSetError(enc->pic, VP8_ENC_ERROR_OUT_OF_MEMORY);
      break;
    }
    const uint64_t size_p0 = wf->size_p0[0] + wf->size_p0[1] + enc->segment_hdr.size;
    if (enc->max_i4_header_bits > 0 && size_p0 > PARTITION0_SIZE_LIMIT) {
      enc->max_i4_header_bits >>= 1;  // as the serial loop: a tighter header, again
      continue;
    }
    break;
  }
  if (ok) {
    FinalizeTokenProbas(&enc->proba);
    for (int y = 0; ok && y < wf->mb_h; ++y) {
      ok = VP8EmitTokens(&wf->rows[y], enc->parts + 0, (const uint8_t*)enc->proba.coeffs, 1);
    }
  }
  DeleteWavefront(wf);
  ok = ok && WebPReportProgress(enc->pic, enc->percent + remaining_progress, &enc->percent);
  VP8EncIterator it;
  VP8IteratorInit(enc, &it);
  return PostLoopFinalize(&it, ok);
}

#else  // no threads: the serial loop

static int WavefrontTokenLoop(VP8Encoder* const enc) { return DrVP8EncTokenLoopSerial(enc); }

#endif  // DR_WAVEFRONT

// libwebp's WebPEncode, calling the loop above: `deepring_webp_encode` below.
#undef VP8EncTokenLoop
#define VP8EncTokenLoop WavefrontTokenLoop
#define WebPEncode DrWebPEncode
#define WebPGetEncoderVersion DrWebPGetEncoderVersion
#define WebPEncodingSetError DrWebPEncodingSetError
#define WebPReportProgress DrWebPReportProgress
#define GetPSNR DrWebPEncGetPSNR
// Used in webp_enc.c before their definitions there; the headers declared the original names.
int DrWebPEncodingSetError(const WebPPicture* const pic, WebPEncodingError error);
int DrWebPReportProgress(const WebPPicture* const pic, int percent, int* const percent_store);
#include "src/enc/webp_enc.c"

// WebPEncode with the main pass on two threads when `config->thread_level` is set.
int deepring_webp_encode(const WebPConfig* config, WebPPicture* picture) {
  return DrWebPEncode(config, picture);
}

// The same, every macroblock on the calling thread (tests the schedule without threads).
int deepring_webp_encode_one_thread(const WebPConfig* config, WebPPicture* picture) {
#if defined(DR_WAVEFRONT)
  dr_one_thread = 1;
  const int ok = DrWebPEncode(config, picture);
  dr_one_thread = 0;
  return ok;
#else
  return DrWebPEncode(config, picture);
#endif
}
