-- worker_fence records a lease-guarded writer's fencing token and refuses it,
-- with an error (SQLSTATE DL001), when a newer token has written under the
-- same name. As an error rather than an empty result, it ends the whole
-- transaction it runs in: the write-behind sends a batch's fence and its
-- writes as one pipelined implicit transaction, with no round trip between
-- them in which to look at the fence's answer.
CREATE FUNCTION worker_fence(fence_name text, fence_token bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO worker_fences (name, token) VALUES (fence_name, fence_token)
    ON CONFLICT (name) DO UPDATE SET token = excluded.token, updated_at = now()
    WHERE worker_fences.token <= excluded.token;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fenced off: % has a token newer than %', fence_name, fence_token
            USING ERRCODE = 'DL001';
    END IF;
    RETURN fence_token;
END;
$$;
