//~ The record of a failed check of a lengths/offsets value (reviewed template, emitted as is by
//~ `cuda::helper_source`). The record is 8 u64 words (see `plan::ERROR_RECORD_WORDS`): the first
//~ violation claims word 0 with atomicCAS and writes words 1 to 6, fences them system-wide (the
//~ record is mapped host memory that the host reads without synchronising), then sets word 7.
#ifndef KF_HELPER_REPORT
#define KF_HELPER_REPORT
// Records a violation of a lengths/offsets input unless an earlier one holds the record.
__device__ __noinline__ void kf_report(unsigned long long* rec, unsigned int tag, unsigned int input, unsigned int kind, long long pos, long long value, long long bound) {
    if (atomicCAS(rec, 0ull, 1ull) != 0ull) return; // only the first violation is recorded
    volatile unsigned long long* r = rec;
    r[1] = tag; r[2] = input; r[3] = kind; r[4] = (unsigned long long)pos; r[5] = (unsigned long long)value; r[6] = (unsigned long long)bound;
    __threadfence_system();
    r[7] = 1ull; // ready
}
#endif
