// The sign-in box: "sign in as NAME" where the server is in dev mode, a
// bearer-token paste box everywhere else.
import { useEffect, useState } from 'react';
import { devSignIn, hasDevSignIn, principalOf } from './auth.js';

export function SignIn({ user, onToken }) {
  const [dev, setDev] = useState(null); // null while unknown
  const [value, setValue] = useState('');
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  useEffect(() => {
    let alive = true;
    hasDevSignIn().then((d) => alive && setDev(d));
    return () => {
      alive = false;
    };
  }, []);

  if (user) {
    return (
      <div className="signin signed-in">
        <span className="who" data-testid="signed-in-as">
          Signed in as <strong>{user}</strong>
        </span>
        <button type="button" className="btn ghost small" onClick={() => onToken(null)}>
          Sign out
        </button>
      </div>
    );
  }
  if (dev === null) return <div className="signin" />;

  const submit = async (e) => {
    e.preventDefault();
    const v = value.trim();
    if (!v) return;
    setError(null);
    if (!dev) {
      const token = v.replace(/^Bearer\s+/i, '');
      if (!principalOf(token)) {
        setError('That does not look like a bearer token (a JWT).');
        return;
      }
      onToken(token);
      return;
    }
    setBusy(true);
    try {
      onToken(await devSignIn(v));
    } catch (err) {
      setError(err.message);
    } finally {
      setBusy(false);
    }
  };

  return (
    <form className="signin" onSubmit={submit}>
      <label className="visually-hidden" htmlFor="signin-name">
        {dev ? 'Sign in as' : 'Bearer token'}
      </label>
      <input
        id="signin-name"
        data-testid="signin-name"
        type={dev ? 'text' : 'password'}
        autoComplete="off"
        spellCheck="false"
        placeholder={dev ? 'Sign in as… (e.g. alice)' : 'Paste a buyer bearer token'}
        value={value}
        onChange={(e) => setValue(e.target.value)}
      />
      <button type="submit" className="btn small" data-testid="signin-submit" disabled={busy}>
        {dev ? 'Sign in' : 'Use token'}
      </button>
      {error && (
        <span className="signin-error" role="alert">
          {error}
        </span>
      )}
      <span className="signin-hint">
        {dev
          ? 'dev mode: any name gets a buyer token'
          : 'a buyer token from your own sign-in (or: dropline token --user NAME)'}
      </span>
    </form>
  );
}
