package db

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// Commit is where a write-behind batch committed without waiting for its
// WAL to reach the disk (ApplyEventsUnflushed). The zero value is a batch
// committed durably. A commit is durable once the server's WAL is flushed
// past LSN, as read on a server that has not restarted since: after a
// crash, recovery ends the WAL where its durable part ended and writes on
// from there, past positions of commits it lost. The session the batch was
// committed on is how that is known: a restart (or the crash of any
// backend, after which PostgreSQL restarts them all) ends every session,
// so a flush position read while Session still exists is of the same WAL
// as LSN.
type Commit struct {
	// Unflushed is true for a batch committed with synchronous_commit off.
	Unflushed bool
	// LSN is the WAL's insert position read right after COMMIT, at or past
	// the end of the commit's record.
	LSN uint64
	// Flushed is the WAL's flush position read at the same moment: how far
	// the commits of earlier batches on Session are durable.
	Flushed uint64
	// Session is the backend the batch committed on.
	Session Session
}

// Session names one backend for as long as it lives: its process id and
// the microsecond it started (pg_stat_activity.backend_start), which a
// later backend with the same id does not share.
type Session struct {
	PID   int32
	Start int64
}

// Durable reports whether c is durable by a flush position read on s
// (Commit.Flushed of a later batch, or Flushed).
func (c Commit) Durable(s Session, flushed uint64) bool {
	return !c.Unflushed || (c.Session == s && c.LSN <= flushed)
}

// commitReport ends an unflushed batch's query, after its COMMIT: the
// WAL's insert and flush positions and the session (Commit). The session
// is read from pg_stat_get_activity, the function under the
// pg_stat_activity view, for this backend alone: the view builds a row of
// every backend and joins the database's and the role's names to them, in
// every batch, and the query is planned every time (a simple query).
const commitReport = `SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint, (pg_current_wal_flush_lsn() - '0/0')::bigint,
	pid, (extract(epoch FROM backend_start) * 1000000)::bigint FROM pg_stat_get_activity(pg_backend_pid())`

// parseCommitReport is the Commit commitReport's row (text format) says.
func parseCommitReport(row [][]byte) (Commit, error) {
	if len(row) != 4 {
		return Commit{}, fmt.Errorf("%d values in the commit's report, want 4", len(row))
	}
	var v [4]int64
	for i, b := range row {
		if b == nil {
			return Commit{}, errors.New("a NULL in the commit's report")
		}
		n, err := strconv.ParseInt(string(b), 10, 64)
		if err != nil {
			return Commit{}, fmt.Errorf("the commit's report: %w", err)
		}
		v[i] = n
	}
	return Commit{Unflushed: true, LSN: uint64(v[0]), Flushed: uint64(v[1]), //nolint:gosec // WAL positions are far below 2^63
		Session: Session{PID: int32(v[2]), Start: v[3]}}, nil //nolint:gosec // a process id
}

// committed reports whether a copied batch's tags show its transaction
// committed: COMMIT last, or, with the commit's report after it, next to
// last.
func committed(tags []string, report bool) bool {
	n := len(tags)
	if report {
		return n >= 2 && tags[n-2] == "COMMIT" && tags[n-1] == "SELECT 1"
	}
	return n >= 1 && tags[n-1] == "COMMIT"
}

// Flushed reads the server's WAL flush position and which of sessions
// still exist: a Commit c is durable when alive[c.Session] and c.LSN <=
// flushed. Both are read by one query, which a restart of the server
// would end with an error: a session found alive shows that flushed is a
// position of the same WAL as its commits'.
func (l *Ledger) Flushed(ctx context.Context, sessions []Session) (flushed uint64, alive map[Session]bool, err error) {
	pids := make([]int32, len(sessions))
	for i, s := range sessions {
		pids[i] = s.PID
	}
	rows, err := l.pool.Query(ctx, `
		SELECT (pg_current_wal_flush_lsn() - '0/0')::bigint, a.pid, (extract(epoch FROM a.backend_start) * 1000000)::bigint
		FROM (SELECT 1) AS one LEFT JOIN pg_stat_get_activity(NULL) AS a ON a.pid = ANY($1::int[])`, pids)
	if err != nil {
		return 0, nil, err
	}
	defer rows.Close()
	alive = map[Session]bool{}
	for rows.Next() {
		var f int64
		var pid *int32
		var start *int64
		if err := rows.Scan(&f, &pid, &start); err != nil {
			return 0, nil, err
		}
		flushed = uint64(f) //nolint:gosec // a WAL position
		if pid != nil && start != nil {
			alive[Session{PID: *pid, Start: *start}] = true
		}
	}
	return flushed, alive, rows.Err()
}
