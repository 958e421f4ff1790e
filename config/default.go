// Package config turns Dropline's environment variables into one typed,
// validated Config. It is loaded once, in cmd/dropline, and its parts are
// passed down; nothing else in the program reads the environment.
//
// Every variable has a default that works with the quick start (`make run`
// against the services `make services` starts), so an empty environment plus
// DROPLINE_DEV=1 is a complete development setup.
package config

import ()

// Default returns the configuration of an empty environment. It is the
// starting point of Load and a convenient base for tests.
func Default() Config {
	return Config{
		RedisURL:        DefaultRedisURL,
		DatabaseURL:     DefaultDatabaseURL,
		Addr:            DefaultAddr,
		KeyPrefix:       DefaultKeyPrefix,
		JWTMaxLifetime:  DefaultJWTMaxLifetime,
		HoldDefault:     DefaultHoldDefault,
		HoldMax:         DefaultHoldMax,
		HoldExtensions:  DefaultHoldExtensions,
		LeaseTTL:        DefaultLeaseTTL,
		RejectionTTL:    DefaultRejectionTTL,
		WaitlistMax:     DefaultWaitlistMax,
		MutationRate:    DefaultMutationRate,
		MutationBurst:   DefaultMutationBurst,
		CostLimit:       DefaultCostLimit,
		CostRate:        DefaultCostRate,
		CostBurst:       DefaultCostBurst,
		ShutdownTimeout: DefaultShutdownTimeout,
		LogLevel:        DefaultLogLevel,
		LogFormat:       LogFormatJSON,

		RedisWaitTimeout:        DefaultRedisWaitTimeout,
		ClientAddrHeader:        DefaultClientAddrHeader,
		StreamConnsPerIP:        DefaultStreamConnsPerIP,
		StreamConnsPerPrincipal: DefaultStreamConnsPerPrin,
		StreamSubsPerConn:       DefaultStreamSubsPerConn,
		StreamMessageBytes:      DefaultStreamMessageBytes,
		ResponseMaxBytes:        DefaultResponseMaxBytes,
		StreamInitTimeout:       DefaultStreamInitTimeout,
		StreamPingInterval:      DefaultStreamPingInterval,
		StreamWriteTimeout:      DefaultStreamWriteTimeout,
		LiveInterval:            DefaultLiveInterval,
		APQBytesPerAddr:         DefaultAPQBytesPerAddr,
		BodyTimeout:             DefaultBodyTimeout,
		RequestsPerAddr:         DefaultRequestsPerAddr,
		WebhookTimeout:          DefaultWebhookTimeout,
		WebhookConcurrency:      DefaultWebhookConcurrency,
		WebhookMaxAttempts:      DefaultWebhookMaxAttempts,
		WebhookBackoff:          DefaultWebhookBackoff,
		WebhookBackoffMax:       DefaultWebhookBackoffMax,
		WebhookRetention:        DefaultWebhookRetention,
		MetricsListener:         MetricsPublic,
	}
}
