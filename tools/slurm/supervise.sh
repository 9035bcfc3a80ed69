# Sourced by the batch scripts of this folder: `run_supervised CMD ...` runs CMD in the background,
# passes the batch shell's signals on to it and requeues the job after a pre-emption.
#
# Why: Slurm's pre-emption warning (`--signal=B:USR1@300`, or `scancel --signal=USR1 --batch JOB`)
# and `scancel` signal the batch shell. Untrapped, USR1 kills bash and the command never sees it;
# a bare `cmd & wait $!` forwards nothing. Here USR1 and TERM go to CMD (deepy.py, run_matrix.py),
# whose workers save at their next step and exit; after USR1 the job is requeued (sbatch
# --requeue) and its next start resumes from `latest`; a run that had reached its last step when
# the signal came (deepy.py writes "finished" into KERPLE_STOP_OUTCOME) is not requeued: its next
# start would have nothing to do. Returns CMD's exit status.
run_supervised() {
    local outcome
    outcome=$(mktemp "${TMPDIR:-/tmp}/kerple-outcome-${SLURM_JOB_ID}.XXXXXX")
    KERPLE_STOP_OUTCOME="${outcome}" "$@" &
    KERPLE_CHILD=$!
    KERPLE_PREEMPTED=0
    trap 'KERPLE_PREEMPTED=1; echo "batch script: USR1 (pre-emption): passing it on; the run saves and stops"; kill -USR1 "${KERPLE_CHILD}"' USR1
    trap 'echo "batch script: TERM: passing it on; the run saves and stops"; kill -TERM "${KERPLE_CHILD}"' TERM
    local status
    while true; do
        wait "${KERPLE_CHILD}"
        status=$?
        kill -0 "${KERPLE_CHILD}" 2>/dev/null || break  # `wait` also returns when a trapped signal arrives
    done
    trap - USR1 TERM
    # saved and stopped: deepy.py exits 0 after a pre-emption, run_matrix.py 128 + USR1
    if [ "${KERPLE_PREEMPTED}" = 1 ] && [ "$(cat "${outcome}")" = finished ]; then
        echo "batch script: the run had finished before the signal took effect: not requeueing job ${SLURM_JOB_ID}"
    elif [ "${KERPLE_PREEMPTED}" = 1 ] && { [ "${status}" = 0 ] || [ "${status}" = 138 ]; }; then
        echo "batch script: saved; requeueing job ${SLURM_JOB_ID}: its next start resumes from latest"
        scontrol requeue "${SLURM_JOB_ID}"
    fi
    rm -f "${outcome}"
    return "${status}"
}
