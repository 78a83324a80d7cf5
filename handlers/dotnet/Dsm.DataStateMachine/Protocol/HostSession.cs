// One protocol session: open, the operations in flight, close; and the year-9999 limit.

using System;
using System.Text;
using System.Threading;
using System.Threading.Tasks;

namespace Dsm.DataStateMachine.Protocol
{
    /// <summary>One protocol session: an <c>open</c>, the requests, a <c>close</c>.</summary>
    internal sealed class HostSession
    {
        private readonly Func<IClock, string, object> factory;
        private readonly bool namedStores;
        private readonly HostOptions options;
        private readonly AnswerStream answers;
        private readonly RequestClock clock = new RequestClock();
        private readonly CancellationTokenSource stopping = new CancellationTokenSource();
        private readonly object flight = new object();
        private int inFlight;
        private IDataStateMachineHandler handler;

        public HostSession(Func<IClock, string, object> factory, bool namedStores, HostOptions options, AnswerStream answers)
        {
            this.factory = factory;
            this.namedStores = namedStores;
            this.options = options;
            this.answers = answers;
        }

        public bool Closed { get; private set; }

        private string Name
        {
            get { return string.IsNullOrEmpty(options.Name) ? "dsm host" : options.Name; }
        }

        public void HandleLine(string line)
        {
            if (line.Trim().Length == 0) return;
            ProtocolRequest request;
            try
            {
                request = ProtocolRequest.Parse(line);
            }
            catch (JsonLineException error)
            {
                Log("a request is not JSON (" + error.Message + "); ignored: " + Shorten(line));
                return;
            }
            if (!request.HasId)
            {
                Log("a request without a positive integer id; ignored: " + Shorten(line));
                return;
            }
            if (request.NotJson != null)
            {
                Log("request " + request.Id + " is " + request.NotJson + "; answered bad_request: " + Shorten(line));
            }
            if (request.Problem != null)
            {
                Refuse(request.Id, new BadRequestException(request.Problem));
                return;
            }
            if (request.Op == "open")
            {
                Open(request);
                return;
            }
            if (request.Op == "close")
            {
                Close(request);
                return;
            }
            if (handler == null)
            {
                Refuse(request.Id, new BadRequestException(request.Op + " before open"));
                return;
            }
            Dispatch(request);
            if (!options.Concurrent) WaitForRequestsInFlight();
        }

        /// <summary>
        /// A line whose bytes are not UTF-8 (<paramref name="error"/>), read with U+FFFD in their
        /// place as <paramref name="replaced"/> only to find its id: answered bad_request, never
        /// served, since a data_json would be stored with characters the client did not send.
        /// </summary>
        public void HandleUndecodable(string replaced, DecoderFallbackException error)
        {
            var bytes = error.BytesUnknown ?? new byte[0];
            var shown = new StringBuilder();
            foreach (var b in bytes) shown.Append(shown.Length == 0 ? "0x" : " 0x").Append(b.ToString("x2"));
            string problem = "the request line is not UTF-8 (it holds byte " + shown
                + "); send UTF-8, with any other character escaped as \\uXXXX";
            ProtocolRequest request = null;
            try
            {
                request = ProtocolRequest.Parse(replaced);
            }
            catch (JsonLineException)
            {
                // Not JSON either: there is no id to answer.
            }
            if (request == null || !request.HasId)
            {
                Log(problem + "; ignored, no id to answer: " + Shorten(replaced));
                return;
            }
            Log("request " + request.Id + ": " + problem + "; answered bad_request: " + Shorten(replaced));
            Refuse(request.Id, new BadRequestException(problem));
        }

        /// <summary>Stdin ended without a close: finish what is in flight and release the store (it is kept).</summary>
        public void EndOfInput()
        {
            WaitForRequestsInFlight();
            stopping.Cancel();
            if (handler == null) return;
            try
            {
                Release(false);
            }
            catch (Exception error)
            {
                Log("closing the handler at the end of input failed: " + Answers.Unwrap(error));
            }
        }

        // --- open and close -------------------------------------------------------------------

        private void Open(ProtocolRequest request)
        {
            if (handler != null)
            {
                Refuse(request.Id, new BadRequestException("open was already answered; one open per process"));
                return;
            }
            bool named = namedStores && request.Store != null;
            var hello = Answers.Begin(request.Id, false);
            hello.Append("{\"protocol\":").Append(DsmProtocolHost.ProtocolVersion);
            hello.Append(",\"concurrent\":").Append(options.Concurrent ? "true" : "false");
            hello.Append(",\"name\":");
            Answers.String(hello, Name);
            hello.Append(",\"shared_store\":").Append(options.SharedStore && request.Store == null ? "true" : "false");
            hello.Append(",\"named_store\":").Append(named ? "true" : "false");
            hello.Append(",\"language\":\"csharp\"");
            if (!request.Offers(DsmProtocolHost.ProtocolVersion))
            {
                // Our version was not offered: say ours and open nothing; the harness stops with
                // VersionMismatchError.
                Log("open did not offer protocol version " + DsmProtocolHost.ProtocolVersion + ", the one this host speaks");
                hello.Append('}');
                answers.Write(Answers.End(hello));
                return;
            }
            clock.Serve(request.Now);
            try
            {
                var made = factory(clock, named ? request.Store : null);
                if (made == null)
                {
                    throw new FactoryException("given to DsmProtocolHost.Run", "returned null", "return a handler for the clock it is given");
                }
                var contract = made as IDataStateMachineHandler;
                var seed = made as Seed.IDataStateMachineHandler;
                if (contract == null && seed != null) contract = new SeedHandlerAdapter(seed);
                if (contract == null)
                {
                    throw new FactoryException(
                        "given to DsmProtocolHost.Run", "returned a " + made.GetType().FullName,
                        "return an IDataStateMachineHandler, or a handler of the seed's Dsm.DataStateMachine.Seed.IDataStateMachineHandler");
                }
                // The harness picks the semantics it judges by from the shape: the seed's
                // interface has no token to fence a stale holder's write with.
                hello.Append(",\"shape\":").Append(contract is SeedHandlerAdapter ? "\"seed\"" : "\"contract\"");
                var lifecycle = contract as IStoreLifecycle;
                if (lifecycle != null) lifecycle.OpenAsync(stopping.Token).GetAwaiter().GetResult();
                handler = contract;
            }
            catch (Exception error)
            {
                Log("open failed: " + Answers.Unwrap(error));
                Refuse(request.Id, error);
                return;
            }
            hello.Append('}');
            answers.Write(Answers.End(hello));
        }

        private void Close(ProtocolRequest request)
        {
            // Everything sent before close is answered before it.
            WaitForRequestsInFlight();
            Closed = true;
            try
            {
                if (handler != null) Release(request.DropStore);
            }
            catch (Exception error)
            {
                Refuse(request.Id, error);
                return;
            }
            var line = Answers.Begin(request.Id, false);
            line.Append("null");
            answers.Write(Answers.End(line));
        }

        private void Release(bool dropStore)
        {
            var closing = handler;
            handler = null;
            var lifecycle = closing as IStoreLifecycle;
            if (lifecycle != null)
            {
                lifecycle.CloseAsync(dropStore, CancellationToken.None).GetAwaiter().GetResult();
                return;
            }
            var disposable = closing as IDisposable;
            if (disposable != null) disposable.Dispose();
        }

        // --- the operations -------------------------------------------------------------------

        private void Dispatch(ProtocolRequest request)
        {
            var ctx = request.Context;
            var token = stopping.Token;
            try
            {
                CheckInstants(request);
                clock.Serve(request.Now);
                switch (request.Op)
                {
                    case "exists":
                        Complete(request.Id, handler.ExistsAsync(ctx, token), (into, found) => into.Append(found ? "true" : "false"));
                        break;
                    case "get":
                        Complete(request.Id, handler.GetAsync(ctx, token), Answers.Record);
                        break;
                    case "try_acquire_lock":
                        Complete(request.Id, handler.TryAcquireLockAsync(ctx, token), Answers.Number);
                        break;
                    case "set":
                        Complete(request.Id, handler.SetAsync(ctx, request.Status, request.Data, token));
                        break;
                    case "release_lock_as_failed":
                        Complete(request.Id, handler.ReleaseLockAsFailedAsync(ctx, request.ErrorDetail, token));
                        break;
                    case "upsert":
                        Complete(request.Id, handler.UpsertAsync(ctx, request.Data, token));
                        break;
                    case "reset_expired_locks":
                        Complete(request.Id, handler.ResetExpiredLocksAsync(token), (into, count) => Answers.Number(into, count));
                        break;
                    case "expire_past_retention":
                        Complete(request.Id, handler.ExpirePastRetentionAsync(token), (into, count) => Answers.Number(into, count));
                        break;
                }
            }
            catch (Exception error)
            {
                // Thrown before the method returned its task: answered the same way.
                Refuse(request.Id, error);
            }
        }

        /// <summary>
        /// The year-9999 limit, checked where the reference model checks it: after the errors
        /// that come first (an unsupported status, a payload over the limit, a release without
        /// a token, which the handler answers), before anything else. A handler never sees an
        /// instant it could not add its lock duration or retention to.
        /// </summary>
        private static void CheckInstants(ProtocolRequest request)
        {
            var config = request.Context == null ? null : request.Context.HandlerConfig;
            switch (request.Op)
            {
                case "try_acquire_lock":
                    config.LockedUntil(request.Now);
                    config.RetainUntil(request.Now);
                    break;
                case "set":
                    if (Statuses.Settable.Contains(request.Status) && WithinLimit(request.Data)) config.RetainUntil(request.Now);
                    break;
                case "release_lock_as_failed":
                    if (request.Context.LockToken.HasValue) config.RetainUntil(request.Now);
                    break;
                case "upsert":
                    if (WithinLimit(request.Data)) config.RetainUntil(request.Now);
                    break;
            }
        }

        private static bool WithinLimit(string data)
        {
            return data == null || data.Length * 3L <= Handlers.Lifecycle.MaxDataBytes
                || Encoding.UTF8.GetByteCount(data) <= Handlers.Lifecycle.MaxDataBytes;
        }

        private void Complete<T>(long id, Task<T> task, Action<StringBuilder, T> result)
        {
            if (task.IsCompleted)
            {
                Answer(id, task, result);
                return;
            }
            lock (flight) inFlight++;
            task.ContinueWith(
                done =>
                {
                    try
                    {
                        Answer(id, done, result);
                    }
                    catch (Exception error)
                    {
                        // Nothing above this continuation would see it: say it, or the request
                        // is left unanswered with stderr empty.
                        Log("answering request " + id + " failed: " + Answers.Unwrap(error));
                    }
                    finally
                    {
                        Landed();
                    }
                },
                CancellationToken.None, TaskContinuationOptions.ExecuteSynchronously, TaskScheduler.Default);
        }

        private void Complete(long id, Task task)
        {
            if (task.IsCompleted)
            {
                Answer(id, task);
                return;
            }
            lock (flight) inFlight++;
            task.ContinueWith(
                done =>
                {
                    try
                    {
                        Answer(id, done);
                    }
                    catch (Exception error)
                    {
                        // Nothing above this continuation would see it: say it, or the request
                        // is left unanswered with stderr empty.
                        Log("answering request " + id + " failed: " + Answers.Unwrap(error));
                    }
                    finally
                    {
                        Landed();
                    }
                },
                CancellationToken.None, TaskContinuationOptions.ExecuteSynchronously, TaskScheduler.Default);
        }

        private void Answer(long id, Task task)
        {
            if (Failed(id, task)) return;
            var line = Answers.Begin(id, false);
            line.Append("null");
            answers.Write(Answers.End(line));
        }

        /// <summary>
        /// Answers a completed task with its result; a result the protocol cannot say (a record
        /// without a key, a status outside the enum) is answered as the exception writing it
        /// threw, <c>internal</c>, and logged: at once or from a continuation alike.
        /// </summary>
        private void Answer<T>(long id, Task<T> task, Action<StringBuilder, T> result)
        {
            if (Failed(id, task)) return;
            var line = Answers.Begin(id, false);
            try
            {
                result(line, task.Result);
            }
            catch (Exception error)
            {
                Log("the result of request " + id + " cannot be written: " + Answers.Unwrap(error).Message + "; answered internal");
                Refuse(id, error);
                return;
            }
            answers.Write(Answers.End(line));
        }

        /// <summary>Answers a task that failed or was cancelled with its error; false when it succeeded.</summary>
        private bool Failed(long id, Task task)
        {
            if (task.IsFaulted)
            {
                Refuse(id, task.Exception);
                return true;
            }
            if (task.IsCanceled)
            {
                Refuse(id, new OperationCanceledException("the handler's task was cancelled"));
                return true;
            }
            return false;
        }

        private void Refuse(long id, Exception error)
        {
            var line = Answers.Begin(id, true);
            Answers.Error(line, error);
            answers.Write(Answers.End(line));
        }

        private void Landed()
        {
            lock (flight)
            {
                inFlight--;
                if (inFlight == 0) Monitor.PulseAll(flight);
            }
        }

        private void WaitForRequestsInFlight()
        {
            lock (flight)
            {
                while (inFlight > 0) Monitor.Wait(flight);
            }
        }

        private void Log(string message)
        {
            Console.Error.WriteLine(Name + ": " + message);
        }

        private static string Shorten(string line)
        {
            return line.Length <= 120 ? line : line.Substring(0, 120) + "... (" + line.Length + " characters)";
        }
    }
}
