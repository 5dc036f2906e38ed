// The synthetic generator's block ids (mooncake_gym/model/workload.py _block_ids) in C++: integer
// arithmetic only, so the ids are the same whichever side makes them (tests/test_engine_envs.py
// compares the two). The draws stay numpy's, in Python.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace mooncake {

// Request r's blocks j < ceil(total[r] / block_tokens): block j of the system prompt prompt[r] while
// j < min(its length, full_shared[r]) (shared by every session with that prompt), else block j of
// session[r]'s shared stream while j < full_shared[r], else the request's own. Ids are numbered in
// order of first appearance (request by request, block by block), as _block_ids' renumbering does.
// Writes starts (n + 1 offsets) and ids (starts[n] of them).
inline void synthetic_block_ids(size_t n, const int64_t* total, const int64_t* full_shared, const int64_t* prompt_blocks,
                                size_t n_prompts, const int64_t* prompt, const int64_t* session, int64_t block_tokens,
                                std::vector<int64_t>& starts, std::vector<int64_t>& ids) {
    if (block_tokens < 1) throw std::invalid_argument("block_tokens: expected >= 1");
    starts.assign(n + 1, 0);
    int64_t max_session = 0;
    for (size_t r = 0; r < n; ++r) {
        if (total[r] < 0 || session[r] < 0 || prompt[r] < 0 || static_cast<size_t>(prompt[r]) >= n_prompts)
            throw std::invalid_argument("synthetic_block_ids: a request's tokens, session or prompt out of range");
        starts[r + 1] = starts[r] + (total[r] + block_tokens - 1) / block_tokens;
        if (session[r] > max_session) max_session = session[r];
    }
    std::vector<int64_t> prompt_offset(n_prompts + 1, 0);
    for (size_t p = 0; p < n_prompts; ++p) prompt_offset[p + 1] = prompt_offset[p] + prompt_blocks[p];
    // a session's stream is at most its longest request's blocks long
    std::vector<int64_t> width(static_cast<size_t>(max_session) + 1, 0), session_offset(static_cast<size_t>(max_session) + 2, 0);
    for (size_t r = 0; r < n; ++r) {
        int64_t& w = width[static_cast<size_t>(session[r])];
        const int64_t m = starts[r + 1] - starts[r];
        if (m > w) w = m;
    }
    for (size_t q = 0; q <= static_cast<size_t>(max_session); ++q) session_offset[q + 1] = session_offset[q] + width[q];
    // the rank given to each shared block (prompt blocks, then the sessions' streams), -1 until seen
    const int64_t n_prompt_ids = prompt_offset[n_prompts];
    std::vector<int64_t> rank(static_cast<size_t>(n_prompt_ids + session_offset.back()), -1);
    ids.resize(static_cast<size_t>(starts[n]));
    int64_t next = 0;
    for (size_t r = 0; r < n; ++r) {
        const int64_t m = starts[r + 1] - starts[r];
        const int64_t p = prompt[r];
        const int64_t shared = full_shared[r];
        const int64_t in_prompt = prompt_blocks[p] < shared ? prompt_blocks[p] : shared;
        int64_t* out = ids.data() + starts[r];
        for (int64_t j = 0; j < m; ++j) {
            int64_t slot;
            if (j < in_prompt) slot = prompt_offset[static_cast<size_t>(p)] + j;
            else if (j < shared) slot = n_prompt_ids + session_offset[static_cast<size_t>(session[r])] + j;
            else {  // the request's own: never seen before
                out[j] = next++;
                continue;
            }
            int64_t& k = rank[static_cast<size_t>(slot)];
            if (k < 0) k = next++;
            out[j] = k;
        }
    }
}

}  // namespace mooncake
