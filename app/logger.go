package app

import (
	"context"
	"io"
	"time"

	"github.com/rs/zerolog"

	"github.com/dropline/dropline/config"
)

// NewLogger builds the root logger from DROPLINE_LOG_LEVEL and
// DROPLINE_LOG_FORMAT. It lives here rather than in main so tests and e2e
// get exactly the production format. cfg must be validated; an unknown
// level falls back to info.
//
// In JSON format, info and debug lines reach w in batches, at least every
// 100 ms (logWriter), and warnings and errors at once; close the returned
// Closer last, after the App has stopped, to write what is waiting. The
// console format, read by a person as it comes, writes every line at once.
func NewLogger(cfg config.Config, w io.Writer) (zerolog.Logger, io.Closer) {
	level, err := zerolog.ParseLevel(cfg.LogLevel)
	if err != nil || cfg.LogLevel == "" {
		level = zerolog.InfoLevel
	}
	var c io.Closer = nopCloser{}
	if cfg.LogFormat == config.LogFormatConsole {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	} else {
		lw := newLogWriter(w, logFlushInterval, logFlushBytes)
		w, c = lw, lw
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger(), c
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// WarnIfDevSecret logs the loud warning dev mode owes its operator: tokens
// are signed with a secret published in the source code.
func WarnIfDevSecret(cfg config.Config, log zerolog.Logger) {
	if !cfg.UsingDevSecret() {
		return
	}
	log.Warn().Msg("!!! DEVELOPMENT MODE: tokens are signed with the public built-in secret, so anyone can forge them. " +
		"Never expose this server; set DROPLINE_JWT_SECRET and unset DROPLINE_DEV in production !!!")
	if !config.LoopbackAddr(cfg.Addr) {
		log.Warn().Str("addr", cfg.Addr).Msg("!!! DEVELOPMENT MODE on a non-loopback address (" + config.EnvDevAllowRemote +
			"=1): whoever reaches this port can mint an admin token !!!")
	}
}

// NewRedisLogger routes go-redis' own messages (it logs failed dials and pool
// trouble on its own) into the root logger at debug level, so a service
// that cannot be reached is reported once, in Dropline's words, and the
// detail is there when DROPLINE_LOG_LEVEL=debug. go-redis takes it through
// its package-level redis.SetLogger, which only cmd/ calls.
func NewRedisLogger(log zerolog.Logger) RedisLogger {
	return RedisLogger{log: log.With().Str("component", "go-redis").Logger()}
}

// RedisLogger is go-redis' logger, writing to zerolog at debug level.
type RedisLogger struct{ log zerolog.Logger }

// Printf implements go-redis' internal.Logging.
func (l RedisLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug().Msgf(format, v...)
}
