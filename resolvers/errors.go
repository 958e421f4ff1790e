package resolvers

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"strings"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/rs/zerolog"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/graph/model"
	"github.com/dropline/dropline/internal/requestid"
	"github.com/dropline/dropline/inventory"
)

// CodeInternal is the extensions.code of every error the client cannot act
// on; the response carries a requestId and the log has the detail.
const CodeInternal = "INTERNAL"

// CodeRateLimited is the code of a spent mutation or cost budget: the
// engine's outcome, whose code the HTTP layer also reports.
var CodeRateLimited = string(inventory.ErrRateLimited.Code())

// Codes of refusals decided here rather than by the engine.
const (
	CodeUnauthenticated = "UNAUTHENTICATED"
	CodeBadUserInput    = "BAD_USER_INPUT"
	// CodeIntrospectionDisabled answers __schema and __type outside dev mode.
	CodeIntrospectionDisabled = "INTROSPECTION_DISABLED"
)

// apiError is an error a resolver has already classified: a business code
// with a public message, or an internal failure whose cause is only logged.
type apiError struct {
	code    string
	message string
	cause   error // internal only; never shown to the client
	logged  bool  // the recover func logged the stack already
}

func (e *apiError) Error() string {
	if e.cause != nil {
		return e.code + ": " + e.cause.Error()
	}
	return e.code + ": " + e.message
}

func (e *apiError) Unwrap() error { return e.cause }

// internal marks err as a failure the client can do nothing about.
func internal(err error) error { return &apiError{code: CodeInternal, cause: err} }

// errUnauthenticated is returned by queries that need a principal.
var errUnauthenticated = &apiError{code: CodeUnauthenticated, message: unauthenticatedMessage}

// unauthenticatedMessage answers an anonymous caller where a principal is
// needed.
const unauthenticatedMessage = "this needs a bearer token: sign in first"

// outcome is how the API reports an engine error: its business code and
// public message, both from the engine's one vocabulary; ok is false when
// err is not a business outcome.
func outcome(err error) (code inventory.Code, message string, ok bool) {
	code = inventory.ErrorCode(err)
	if code == "" {
		return "", "", false
	}
	return code, inventory.ErrorMessage(err), true
}

// queryError turns an engine error into what a query field returns: a coded
// top-level error for business outcomes (queries have no userErrors) and
// an internal error otherwise.
func queryError(err error) error {
	if code, message, ok := outcome(err); ok {
		return &apiError{code: string(code), message: message}
	}
	return internal(err)
}

// userError maps an engine error to a payload's userError. It returns a
// non-nil error only when err is not a business outcome: that is a real
// failure and goes to the error presenter.
func userError(err error) (*model.UserError, error) {
	var limited *inventory.RateLimitedError
	if errors.As(err, &limited) {
		return rateLimitedError(limited.RetryAfter), nil
	}
	code, message, ok := outcome(err)
	if !ok {
		return nil, internal(err)
	}
	ue := &model.UserError{Code: model.ErrorCode(code), Message: message}
	var (
		inv *inventory.InvalidInputError
		nf  *inventory.NotFoundError
	)
	switch {
	case errors.As(err, &inv):
		ue.Field = inputPath(inv.Field)
	case errors.As(err, &nf):
		ue.Field = inputPath(nf.Field)
	case code == inventory.ErrOutOfStock.Code() || code == inventory.ErrQuotaExceeded.Code():
		ue.Field = []string{"input", "quantity"}
	case code == inventory.ErrIdempotencyKeyReused.Code():
		ue.Field = []string{"input", "idempotencyKey"}
	case code == inventory.ErrExtensionLimit.Code():
		ue.Field = []string{"input", "holdSeconds"}
	}
	return ue, nil
}

// inputPath turns an engine field name ("price.amount") into a path from
// the mutation argument (["input","price","amount"]). The engine's
// "principal" comes from the token, not the input, so it has no path.
func inputPath(field string) []string {
	switch field {
	case "", "principal":
		return nil
	case "input":
		return []string{"input"}
	}
	return append([]string{"input"}, strings.Split(field, ".")...)
}

func rateLimitedError(retryAfter time.Duration) *model.UserError {
	secs := int(math.Ceil(retryAfter.Seconds()))
	if secs < 1 {
		secs = 1
	}
	return &model.UserError{
		Code:              model.ErrorCodeRateLimited,
		Message:           fmt.Sprintf("too many mutations: retry in %d s", secs),
		RetryAfterSeconds: &secs,
	}
}

// presenter is the one place errors become what clients see. Errors built
// by gqlgen itself (parse, validation, limits) pass through; classified
// resolver errors show their code; anything else is logged with the request
// id and shown as "internal error".
func presenter() graphql.ErrorPresenterFunc {
	return func(ctx context.Context, err error) *gqlerror.Error {
		var gqlErr *gqlerror.Error
		if !errors.As(err, &gqlErr) {
			gqlErr = gqlerror.WrapPath(graphql.GetPath(ctx), err)
		}
		cause := gqlErr.Err
		if cause == nil {
			return gqlErr // made deliberately, message and code already public
		}
		out := &gqlerror.Error{Path: gqlErr.Path, Locations: gqlErr.Locations, Rule: gqlErr.Rule}
		var ae *apiError
		switch {
		case isIntrospection(ctx) && !errors.As(cause, &ae):
			// gqlgen refuses __schema and __type outside dev mode with a
			// plain error; it is a refusal, not a failure.
			out.Message = "introspection is disabled"
			out.Extensions = map[string]any{"code": CodeIntrospectionDisabled}
		case errors.As(cause, &ae) && ae.code != CodeInternal:
			out.Message = ae.message
			out.Extensions = map[string]any{"code": ae.code}
		case errors.As(cause, &ae) || inventory.ErrorCode(cause) == "" && !isInputCoercion(ctx):
			id := requestid.From(ctx)
			if ae == nil || !ae.logged {
				zerolog.Ctx(ctx).Error().Err(cause).Str("path", gqlErr.Path.String()).Msg("graphql internal error")
			}
			out.Message = "internal error"
			out.Extensions = map[string]any{"code": CodeInternal, "requestId": id}
		case inventory.ErrorCode(cause) != "":
			code, message, _ := outcome(cause)
			out.Message = message
			out.Extensions = map[string]any{"code": string(code)}
		default:
			// A scalar or enum argument the client sent could not be read
			// (a bad Time, say): the parser's message is about their input.
			out.Message = gqlErr.Message
			out.Extensions = map[string]any{"code": CodeBadUserInput}
		}
		return out
	}
}

func isIntrospection(ctx context.Context) bool {
	fc := graphql.GetFieldContext(ctx)
	return fc != nil && (fc.Field.Name == "__schema" || fc.Field.Name == "__type")
}

// isInputCoercion reports whether an unclassified error was raised while
// reading a field's arguments: gqlgen returns those before calling the
// resolver, so the field context has no arguments yet.
func isInputCoercion(ctx context.Context) bool {
	fc := graphql.GetFieldContext(ctx)
	return fc != nil && fc.Args == nil && len(fc.Field.Arguments) > 0
}

// recoverer turns a panic in a resolver into an internal error, logged
// once with its stack.
func recoverer() graphql.RecoverFunc {
	return func(ctx context.Context, v any) error {
		zerolog.Ctx(ctx).Error().Str("panic", fmt.Sprint(v)).
			Bytes("stack", debug.Stack()).Msg("graphql resolver panic")
		return &apiError{code: CodeInternal, cause: fmt.Errorf("panic: %v", v), logged: true}
	}
}
